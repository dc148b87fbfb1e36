# Take nodes offline (Set-HpcNodeState: a cluster administrator's cmdlet). Without -Force a node that runs
# a job drains first, and its page warns that this "can take a long time" and, under a job that runs until
# canceled, "does not return": hence -Async (return at once), and hpcjob reads the nodes' states after,
# with a bound. -Force: "go offline without going into the draining state first". The nodes' names come
# from $Data, never from the script's text.
param($Data)
# The HPC cmdlets: loaded only where the session does not have them yet (a Windows PowerShell snap-in).
if (-not (Get-Command -Name Get-HpcJob -ErrorAction SilentlyContinue)) {
    Add-PSSnapin -Name Microsoft.HPC
}
Set-HpcNodeState -Name $Data.Names -State Offline -Force:([bool]$Data.Force) -Async -Confirm:$false | Out-Null
