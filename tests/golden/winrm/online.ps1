# Bring nodes online (Set-HpcNodeState: a cluster administrator's cmdlet); -Async: at once, and hpcjob
# reads the nodes' states after, with a bound. The nodes' names come from $Data.
param($Data)
# The HPC cmdlets: loaded only where the session does not have them yet (a Windows PowerShell snap-in).
if (-not (Get-Command -Name Get-HpcJob -ErrorAction SilentlyContinue)) {
    Add-PSSnapin -Name Microsoft.HPC
}
Set-HpcNodeState -Name $Data.Names -State Online -Async -Confirm:$false | Out-Null
