# What the scheduler keeps of each task's output (its first bytes), for when the share is out of reach.
param($Data)
{% include "winrm/_snapin.ps1" %}
$job = Get-HpcJob -Id $Data.JobId
@(Get-HpcTask -Job $job -State All | ForEach-Object {
    [pscustomobject]@{
        RequiredNodes = [string]$_.RequiredNodes
        AllocatedNodes = [string]$_.AllocatedNodes
        Output = [string]$_.Output
    }
})
