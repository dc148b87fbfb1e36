# The nodes (of $Data.Group when given). UNVERIFIED: the names ProcessorCores and Groups of an HpcNode's
# properties (NetBiosName, NodeState and NodeHealth are documented). Get-HpcNode is documented as a
# cluster administrator's cmdlet: when it is refused, the answer says why (Refused) and nothing else.
param($Data)
{% include "winrm/_snapin.ps1" %}
try {
    if ($Data.Group) {
        $nodes = @(Get-HpcNode -GroupName $Data.Group)
    } else {
        $nodes = @(Get-HpcNode)
    }
} catch {
    $refused = [string]$_.Exception.Message
    return [pscustomobject]@{ Refused = $refused }
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
