# Put nodes in a node group, made first where the cluster has none of that name (Get-HpcGroup, New-HpcGroup
# and Add-HpcGroup: a cluster administrator's cmdlets; MicrosoftDocs/windows-powershell-docs @ 1095f968
# docset/winserver2012r2-ps/hpc/Add-HpcGroup.md). -NodeName is a filter: a node the cluster does not know
# is left out without an error, so the client reads the members back (docs/facts/hpcpack-node-groups.md).
# The group's and the nodes' names come from $Data, never from the script's text.
param($Data)
# The HPC cmdlets: loaded only where the session does not have them yet (a Windows PowerShell snap-in).
if (-not (Get-Command -Name Get-HpcJob -ErrorAction SilentlyContinue)) {
    Add-PSSnapin -Name Microsoft.HPC
}
if (-not (Get-HpcGroup -Name $Data.Group -ErrorAction SilentlyContinue)) {
    New-HpcGroup -Name $Data.Group -Description $Data.Description | Out-Null
}
Add-HpcGroup -Name $Data.Group -NodeName $Data.Names | Out-Null
