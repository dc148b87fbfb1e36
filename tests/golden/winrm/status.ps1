# One job and all its tasks, in one command whatever the number of tasks.
param($Data)
# The HPC cmdlets: loaded only where the session does not have them yet (a Windows PowerShell snap-in).
if (-not (Get-Command -Name Get-HpcJob -ErrorAction SilentlyContinue)) {
    Add-PSSnapin -Name Microsoft.HPC
}
$job = Get-HpcJob -Id $Data.JobId
[pscustomobject]@{
    Id = $job.Id
    Name = $job.Name
    State = [string]$job.State
    ErrorMessage = [string]$job.ErrorMessage
    Tasks = @(Get-HpcTask -Job $job -State All | ForEach-Object {
        [pscustomobject]@{
            TaskId = [string]$_.TaskId
            Name = $_.Name
            State = [string]$_.State
            ExitCode = $_.ExitCode
            RequiredNodes = [string]$_.RequiredNodes
            AllocatedNodes = [string]$_.AllocatedNodes
            ErrorMessage = [string]$_.ErrorMessage
            StartTime = [string]$_.StartTime
            EndTime = [string]$_.EndTime
        }
    })
}
