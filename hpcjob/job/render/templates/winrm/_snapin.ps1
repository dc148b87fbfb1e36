# The HPC cmdlets: loaded only where the session does not have them yet (a Windows PowerShell snap-in).
if (-not (Get-Command -Name Get-HpcJob -ErrorAction SilentlyContinue)) {
    Add-PSSnapin -Name Microsoft.HPC
}
