<#
.SYNOPSIS
Deploys a GPU cluster from HPC Pack's ARM template with hpcjob: a thin entry over `hpcjob cluster onboard`.

.DESCRIPTION
Checks everything first (name, node count, GPU size and image, quota, every template parameter), then
runs az group create and az deployment group create with the template pinned to a commit, shows each
resource as it finishes, writes the cluster's hpcjob profile and mounts the share on the nodes.
The admin password reaches hpcjob through its environment, for the child process only, and az through
its standard input: never a command line. Needs the Azure CLI, logged in (az login). See arm/README.md.

.EXAMPLE
.\scripts\Onboard.ps1 -Name gpu1 -ResourceGroup rg-gpu1 -Location eastus -VmSize Standard_NC24ads_A100_v4 -Nodes 2

.EXAMPLE
.\scripts\Onboard.ps1 -Name gpu1 -ResourceGroup rg-gpu1 -Location eastus -VmSize Standard_NC24ads_A100_v4 -Nodes 2 -WhatIf
Checks, writes the parameters file and prints the az commands; deploys nothing.
#>
[CmdletBinding(SupportsShouldProcess = $true)]
param(
    [Parameter(Mandatory = $true)][ValidatePattern('^[a-z][a-z0-9]{2,14}$')][string]$Name,
    [Parameter(Mandatory = $true)][string]$ResourceGroup,
    [Parameter(Mandatory = $true)][string]$Location,
    [Parameter(Mandatory = $true)][string]$VmSize,
    [Parameter(Mandatory = $true)][ValidateRange(1, 500)][int]$Nodes,
    [string]$AdminUser = 'hpcadmin',
    [string]$Image,
    [securestring]$AdminPassword,
    [switch]$NoCheck
)

$repo = Split-Path -Parent $PSScriptRoot
$hpcjob = Join-Path $repo '.venv\Scripts\hpcjob.exe'
if (-not (Test-Path $hpcjob)) { $hpcjob = 'hpcjob' }

$arguments = @(
    'cluster', 'onboard', $Name, '--resource-group', $ResourceGroup, '--location', $Location,
    '--vm-size', $VmSize, '--nodes', $Nodes, '--admin-user', $AdminUser
)
if ($Image) { $arguments += @('--image', $Image) }
if ($NoCheck) { $arguments += '--no-check' }
if (-not $PSCmdlet.ShouldProcess("resource group $ResourceGroup", "deploy HPC Pack cluster $Name")) {
    $arguments += '--print-only'
}

$hadPassword = Test-Path Env:HPCJOB_ADMIN_PASSWORD
if ($AdminPassword) {
    $env:HPCJOB_ADMIN_PASSWORD = [System.Net.NetworkCredential]::new('', $AdminPassword).Password
}
try {
    & $hpcjob @arguments
    if ($LASTEXITCODE -ne 0) { throw "hpcjob cluster onboard failed (exit code $LASTEXITCODE)" }
}
finally {
    if ($AdminPassword -and -not $hadPassword) { Remove-Item Env:HPCJOB_ADMIN_PASSWORD -ErrorAction SilentlyContinue }
}
