# The nodes (of $Data.Group when given). UNVERIFIED: the names ProcessorCores and Groups of an HpcNode's
# properties (NetBiosName, NodeState and NodeHealth are documented).
param($Data)
# The HPC cmdlets: loaded only where the session does not have them yet (a Windows PowerShell snap-in).
if (-not (Get-Command -Name Get-HpcJob -ErrorAction SilentlyContinue)) {
    Add-PSSnapin -Name Microsoft.HPC
}
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
