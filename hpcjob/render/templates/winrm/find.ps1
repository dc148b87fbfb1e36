# The user's jobs named one of $Data.Names (the run ids): Id and Name of each.
param($Data)
{% include "winrm/_snapin.ps1" %}
@(Get-HpcJob -State All | Where-Object { $Data.Names -contains $_.Name } | ForEach-Object {
    [pscustomobject]@{ Id = $_.Id; Name = $_.Name }
})
