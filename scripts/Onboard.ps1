<#
.SYNOPSIS
Deploys a GPU cluster from HPC Pack's ARM template with hpcjob: New-HpcTorchCluster from this
checkout's PowerShell module, for those who would rather run a script.

.DESCRIPTION
Takes New-HpcTorchCluster's parameters (Get-Help New-HpcTorchCluster -Full after Import-Module
.\powershell\HpcTorch). See hpcjob/azure/arm/README.md.

.EXAMPLE
.\scripts\Onboard.ps1 -Name gpu1 -ResourceGroup rg-gpu1 -Location eastus -VmSize Standard_NC24ads_A100_v4 -Nodes 2 -AdminPassword (Read-Host -AsSecureString)

.EXAMPLE
.\scripts\Onboard.ps1 -Name gpu1 -ResourceGroup rg-gpu1 -Location eastus -VmSize Standard_NC24ads_A100_v4 -Nodes 2 -WhatIf
Checks, writes the parameters file and prints the az commands; deploys nothing.
#>
Import-Module (Join-Path (Split-Path -Parent $PSScriptRoot) 'powershell\HpcTorch\HpcTorch.psd1') -Force
# Splatting $args hands the named parameters (-Name gpu1 ..., -WhatIf) on as they were given; a failure
# is the script's exit code too (for `powershell -File`).
New-HpcTorchCluster @args -ErrorVariable failed
if ($failed) { exit 1 }
