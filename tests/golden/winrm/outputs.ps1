# What the scheduler keeps of each task's output (its first bytes), for when the share is out of reach.
param($Data)
# The HPC cmdlets: loaded only where the session does not have them yet (a Windows PowerShell snap-in).
if (-not (Get-Command -Name Get-HpcJob -ErrorAction SilentlyContinue)) {
    Add-PSSnapin -Name Microsoft.HPC
}
$job = Get-HpcJob -Id $Data.JobId
@(Get-HpcTask -Job $job -State All | ForEach-Object {
    [pscustomobject]@{
        RequiredNodes = [string]$_.RequiredNodes
        AllocatedNodes = [string]$_.AllocatedNodes
        Output = [string]$_.Output
    }
})
