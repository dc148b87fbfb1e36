# Cancel a job unless it has ended or is being canceled (then a forced cancel only): Stop-HpcJob is
# documented for a job that is Configuring, Submitted, Validating, Queued or Running. Output: whether
# this canceled it, and the state it was in.
param($Data)
{% include "winrm/_snapin.ps1" %}
$job = Get-HpcJob -Id $Data.JobId
$state = [string]$job.State
$canceled = $false
$ended = @('Finished', 'Failed', 'Canceled') -contains $state
if (-not ($ended -or ($state -eq 'Canceling' -and -not $Data.Force))) {
    Stop-HpcJob -Job $job -Force:([bool]$Data.Force) -Message $Data.Message -Confirm:$false
    $canceled = $true
}
[pscustomobject]@{ Canceled = $canceled; State = $state }
