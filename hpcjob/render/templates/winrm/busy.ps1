# The nodes that running jobs hold now, whoever owns them (-Owner *, as job list /user:*: UNVERIFIED).
param($Data)
{% include "winrm/_snapin.ps1" %}
@(Get-HpcJob -State Running -Owner * | ForEach-Object {
    [pscustomobject]@{ AllocatedNodes = [string]$_.AllocatedNodes }
})
