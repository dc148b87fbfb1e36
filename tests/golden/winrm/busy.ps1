# The nodes that running jobs hold now, whoever owns them (-Owner *, as job list /user:*: UNVERIFIED).
param($Data)
# The HPC cmdlets: loaded only where the session does not have them yet (a Windows PowerShell snap-in).
if (-not (Get-Command -Name Get-HpcJob -ErrorAction SilentlyContinue)) {
    Add-PSSnapin -Name Microsoft.HPC
}
@(Get-HpcJob -State Running -Owner * | ForEach-Object {
    [pscustomobject]@{ AllocatedNodes = [string]$_.AllocatedNodes }
})
