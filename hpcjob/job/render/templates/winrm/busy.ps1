# The nodes that running jobs hold now. -Owner takes no wildcard (its documented page); with -State
# and no -Owner, Get-HpcJob gives every user's jobs in that state (the page's note on its default:
# UNVERIFIED that other users' AllocatedNodes are shown to an ordinary user).
param($Data)
{% include "winrm/_snapin.ps1" %}
@(Get-HpcJob -State Running | ForEach-Object {
    [pscustomobject]@{ AllocatedNodes = [string]$_.AllocatedNodes }
})
