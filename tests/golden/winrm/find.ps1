# The user's jobs named one of $Data.Names (the run ids): Id and Name of each.
param($Data)
# The HPC cmdlets: loaded only where the session does not have them yet (a Windows PowerShell snap-in).
if (-not (Get-Command -Name Get-HpcJob -ErrorAction SilentlyContinue)) {
    Add-PSSnapin -Name Microsoft.HPC
}
@(Get-HpcJob -State All | Where-Object { $Data.Names -contains $_.Name } | ForEach-Object {
    [pscustomobject]@{ Id = $_.Id; Name = $_.Name }
})
