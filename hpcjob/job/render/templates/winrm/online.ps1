# Bring nodes online (Set-HpcNodeState: a cluster administrator's cmdlet); -Async: at once, and hpcjob
# reads the nodes' states after, with a bound. The nodes' names come from $Data.
param($Data)
{% include "winrm/_snapin.ps1" %}
Set-HpcNodeState -Name $Data.Names -State Online -Async -Confirm:$false | Out-Null
