# Put nodes in a node group, made first where the cluster has none of that name (Get-HpcGroup, New-HpcGroup
# and Add-HpcGroup: a cluster administrator's cmdlets; New-HpcGroup's and Add-HpcGroup's reference pages
# not read: UNVERIFIED). The group's and the nodes' names come from $Data, never from the script's text.
param($Data)
# The HPC cmdlets: loaded only where the session does not have them yet (a Windows PowerShell snap-in).
if (-not (Get-Command -Name Get-HpcJob -ErrorAction SilentlyContinue)) {
    Add-PSSnapin -Name Microsoft.HPC
}
if (-not (Get-HpcGroup -Name $Data.Group -ErrorAction SilentlyContinue)) {
    New-HpcGroup -Name $Data.Group -Description $Data.Description | Out-Null
}
Add-HpcGroup -Name $Data.Group -NodeName $Data.Names | Out-Null
