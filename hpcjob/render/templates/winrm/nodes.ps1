# The nodes (of $Data.Group when given). UNVERIFIED: the names ProcessorCores and Groups of an HpcNode's
# properties (NetBiosName, NodeState and NodeHealth are documented).
param($Data)
{% include "winrm/_snapin.ps1" %}
if ($Data.Group) {
    $nodes = @(Get-HpcNode -GroupName $Data.Group)
} else {
    $nodes = @(Get-HpcNode)
}
@($nodes | ForEach-Object {
    [pscustomobject]@{
        NetBiosName = $_.NetBiosName
        NodeState = [string]$_.NodeState
        NodeHealth = [string]$_.NodeHealth
        ProcessorCores = $_.ProcessorCores
        Groups = [string]$_.Groups
    }
})
