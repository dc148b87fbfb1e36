# The jobs named one of $Data.Names (the run ids): Id and Name of each. One Get-HpcJob -Name per name
# (a handful), rather than every job of the cluster listed and filtered here.
param($Data)
{% include "winrm/_snapin.ps1" %}
@($Data.Names | ForEach-Object { Get-HpcJob -Name $_ -State All } | ForEach-Object {
    [pscustomobject]@{ Id = $_.Id; Name = $_.Name }
})
