@{
    RootModule        = 'HpcTorch.psm1'
    ModuleVersion     = '0.1.0'
    GUID              = '5b8f3c1e-7d2a-4c6e-9f41-2a9d6e0b7c35'
    Author            = 'hpcjob'
    Description       = 'PyTorch DistributedDataParallel training on Microsoft HPC Pack clusters: PowerShell commands over the hpcjob CLI.'
    PowerShellVersion = '5.1'
    FunctionsToExport = @(
        'Submit-HpcTorchJob',
        'Get-HpcTorchJob',
        'Wait-HpcTorchJob',
        'Stop-HpcTorchJob',
        'Receive-HpcTorchJobLog',
        'Get-HpcTorchNode',
        'Mount-HpcTorchShare',
        'Test-HpcTorchCluster',
        'New-HpcTorchCluster',
        'Invoke-HpcTorchJob',
        'Receive-HpcTorchJobResult'
    )
    CmdletsToExport   = @()
    VariablesToExport = @()
    AliasesToExport   = @()
    PrivateData       = @{
        PSData = @{
            Tags       = @('HPCPack', 'PyTorch', 'DDP', 'GPU', 'HPC')
        }
    }
}
