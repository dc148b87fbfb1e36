# The jobs named one of $Data.Names (the run ids): Id and Name of each. One Get-HpcJob -Name per name
# (a handful), rather than every job of the cluster listed and filtered here.
param($Data)
# The HPC cmdlets: loaded only where the session does not have them yet (a Windows PowerShell snap-in).
if (-not (Get-Command -Name Get-HpcJob -ErrorAction SilentlyContinue)) {
    Add-PSSnapin -Name Microsoft.HPC
}
@($Data.Names | ForEach-Object { Get-HpcJob -Name $_ -State All } | ForEach-Object {
    [pscustomobject]@{ Id = $_.Id; Name = $_.Name }
})
