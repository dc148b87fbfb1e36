# Create a job from its XML and submit it as the user. The password arrives here only inside stdin and
# becomes a PSCredential through .NET; it never appears on a command line, and it is given to this one
# submission (Submit-HpcJob -Credential), not cached on the cluster (Set-HpcJobCredential would).
# Output: the job's Id.
param($Data)
{% include "winrm/_snapin.ps1" %}
$secret = [System.Net.NetworkCredential]::new('', $Data.Password).SecurePassword
$credential = [System.Management.Automation.PSCredential]::new($Data.User, $secret)
$file = [System.IO.Path]::GetTempFileName()
try {
    [System.IO.File]::WriteAllText($file, $Data.JobXml)
    $job = New-HpcJob -JobFile $file
} finally {
    Remove-Item -LiteralPath $file -ErrorAction SilentlyContinue
}
try {
    Submit-HpcJob -Job $job -Credential $credential | Out-Null
} catch {
    # Nothing half-made is left in the scheduler; and when that fails too, the error says so.
    $failed = $_.Exception.Message
    try {
        Stop-HpcJob -Job $job -Force -Message 'submission by hpcjob failed' -Confirm:$false
    } catch {
        throw "submitting job $($job.Id) failed: $failed; canceling it failed too: $($_.Exception.Message); job $($job.Id) is left in $([string]$job.State): cancel it with hpcjob cancel $($job.Id)"
    }
    throw "submitting job $($job.Id) failed, and hpcjob canceled it: $failed"
}
[pscustomobject]@{ Id = $job.Id }
