# HpcTorch: PowerShell commands over the hpcjob CLI (Windows PowerShell 5.1 and PowerShell 7).
#
# Each command turns its bound parameters into hpcjob arguments through one table, $script:Cli, and one
# function, ConvertTo-HpcTorchArgument: tests/test_powershell_module.py reads both from this file and
# checks every argument list against the click commands themselves, so the two cannot drift apart.
# Secrets never travel as arguments: a -Credential reaches hpcjob through environment variables of this
# process, set for the call and restored after it.

Set-StrictMode -Version 3.0

# The options every job command shares: hpcjob's job options, one table (hpcjob/job/options.py), each
# parameter named and checked from it by tests/test_powershell_module.py.
$script:JobOptions = @{
    Nodes        = '--nodes'
    NprocPerNode = '--nproc-per-node'
    GpusPerNode  = '--gpus-per-node'
    Node         = '--node'
    NodeGroup    = '--node-group'
    Name         = '--name'
    Share        = '--share'
    MountPoint   = '--mount-point'
    MountOptions = '--mount-options'
    JobFolder    = '--job-folder'
    RdzvPort     = '--rdzv-port'
    RdzvTimeout  = '--rdzv-timeout'
    RdzvLastCall = '--rdzv-last-call'
    RdzvKeepAlive = '--rdzv-keep-alive'
    MinNodes     = '--min-nodes'
    Environment  = '--env'
    Secret       = '--secret'
    MaxRestarts  = '--max-restarts'
    Python       = '--python'
    CommandLimit = '--command-limit'
    RunId        = '--run-id'
    ResumeFrom   = '--resume-from'
    Runtime      = '--runtime'
    HangTimeout  = '--hang-timeout'
    Priority     = '--priority'
    JobTemplate  = '--job-template'
    ExcludeNode  = '--exclude-node'
    Requirements = '--requirements'
    Wheelhouse   = '--wheelhouse'
    NoEnv        = '--no-env'
    EnvOn        = '--env-on'
    Image        = '--image'
    VmSize       = '--vm-size'
    DataNodes    = '--data-nodes'
    DataNode     = '--data-node'
    DataNodeGroup = '--data-node-group'
    DataPort     = '--data-port'
    DataWait     = '--data-wait'
    Dataset      = '--dataset'
    DatasetTimeout = '--dataset-timeout'
    DatasetCacheGb = '--dataset-cache-gb'
}
$script:SmbOptions = @{ SmbUser = '--smb-user'; SmbServer = '--smb-server'; SmbPort = '--smb-port' }
$script:ClusterOptions = @{ Cluster = '--cluster'; Backend = '--backend' }

# Per command: the hpcjob words it runs (Words), its parameters' options (Options), the parameters
# passed as arguments after '--' in order (Arguments), the option -WhatIf adds (WhatIf), and the
# options it leaves out on purpose (Unexposed: the module sets them, or they have no use here).
$script:Cli = @{
    'Submit-HpcTorchJob'       = @{
        Words     = @('submit', '--json')
        Options   = $script:ClusterOptions + $script:SmbOptions + $script:JobOptions + @{
            Wait = '--wait'; NoMountStep = '--no-mount-step'; Tag = '--tag'; Pull = '--pull'; PullTo = '--pull-to'
            Retries = '--retries'; RetryOn = '--retry-on'; NodeWait = '--node-wait'; MaxCost = '--max-cost'
        }
        Arguments = @('Script', 'ArgumentList')
        WhatIf    = '--dry-run'
        Unexposed = @('--mount-step')
    }
    'Invoke-HpcTorchJob'       = @{
        Words     = @('run', '--local', '--json')
        Options   = $script:JobOptions + @{
            Quiet = '--quiet'; GracePeriod = '--grace-period'; Tag = '--tag'; Pull = '--pull'; PullTo = '--pull-to'
            Retries = '--retries'; RetryOn = '--retry-on'
        }
        Arguments = @('Script', 'ArgumentList')
        Unexposed = @('--node-wait', '--max-cost')  # a local run waits for no node and has no price
    }
    'Get-HpcTorchJob'          = @{
        Words     = @('status', '--json')
        Options   = $script:ClusterOptions
        Arguments = @('Id')
        Unexposed = @()
    }
    'Get-HpcTorchJob:List'     = @{
        Words     = @('runs', '--json')
        Options   = @{ Cluster = '--cluster'; Last = '--last'; Tag = '--tag'; Since = '--since' }
        Arguments = @()
        # The module keeps the jobs in -State as `status` sees them now, not as last recorded.
        Unexposed = @('--backend', '--state')
    }
    'Wait-HpcTorchJob'         = @{
        Words     = @('status', '--json')
        Options   = $script:ClusterOptions
        Arguments = @('Id')
        Unexposed = @()
    }
    # -Follow: the run followed as `hpcjob wait` follows it, its attempts too.
    'Wait-HpcTorchJob:Follow'  = @{
        Words     = @('wait', '--json')
        Options   = @{ MaxCost = '--max-cost' }
        Arguments = @('Id')
        Unexposed = @()
    }
    'Stop-HpcTorchJob'         = @{
        Words     = @('cancel')
        Options   = $script:ClusterOptions + @{ Force = '--force' }
        Arguments = @('Id')
        Unexposed = @()
    }
    'Receive-HpcTorchJobLog'   = @{
        Words     = @('logs')
        Options   = $script:SmbOptions + @{
            Cluster = '--cluster'; Node = '--node'; Follow = '--follow'; Share = '--share'
            MountPoint = '--mount-point'; JobFolder = '--job-folder'; PollSeconds = '--poll'
            IdleTimeout = '--idle-timeout'
        }
        Arguments = @('Id')
        Unexposed = @()
    }
    'Receive-HpcTorchJobResult' = @{
        Words     = @('pull')
        Options   = $script:SmbOptions + @{ Destination = '--to' }
        Arguments = @('Id')
        Unexposed = @()
    }
    'Get-HpcTorchNode'         = @{
        Words     = @('nodes', '--json')
        Options   = $script:ClusterOptions + @{ Group = '--group'; AllGroups = '--all-groups' }
        Arguments = @()
        Unexposed = @()
    }
    'Mount-HpcTorchShare'      = @{
        Words     = @('mount', '--json')
        Options   = $script:ClusterOptions + @{
            Node = '--node'; NodeGroup = '--node-group'; Share = '--share'; MountPoint = '--mount-point'
            MountOptions = '--mount-options'; Install = '--install'; AllowImage = '--allow-image'
            AllowDockerOption = '--allow-docker-option'; AllowVolume = '--allow-volume'
            LocalDisks = '--local-disks'
        }
        Arguments = @()
        WhatIf    = '--dry-run'
        Unexposed = @()
    }
    'Test-HpcTorchCluster'     = @{
        Words     = @('doctor', '--json')
        Options   = $script:ClusterOptions + @{ Requirements = '--requirements'; Image = '--image'; Local = '--local' }
        Arguments = @()
        Unexposed = @()
    }
    'New-HpcTorchCluster'      = @{
        Words     = @('cluster', 'onboard')
        Options   = @{
            ResourceGroup = '--resource-group'; Location = '--location'; VmSize = '--vm-size'
            Nodes = '--nodes'; AdminUser = '--admin-user'; Image = '--image'; NodePrefix = '--node-prefix'
            HeadNodeSize = '--head-node-size'; WhatIfAzure = '--what-if'; OutputFolder = '--out'; Spot = '--spot'
            Template = '--template'; NoCheck = '--no-check'; PollSeconds = '--poll-interval'
            PurgeDeletedVault = '--purge-deleted-vault'
            Default = '--default'; DataNodes = '--data-nodes'; DataVmSize = '--data-vm-size'
            Identity = '--identity'
        }
        Arguments = @('Name')
        WhatIf    = '--print-only'
        # The secrets' variables are this module's own (-AdminPassword, -AuthenticationKey).
        Unexposed = @('--password-env', '--key-env')
    }
}

# The environment variables that carry secrets to hpcjob (hpcjob/store/config.py names them too).
$script:CredentialUserVariable = 'HPCJOB_CREDENTIAL_USER'
$script:CredentialPasswordVariable = 'HPCJOB_CREDENTIAL_PASSWORD'
$script:AdminPasswordVariable = 'HPCJOB_ADMIN_PASSWORD'
$script:AuthKeyVariable = 'HPCJOB_AUTH_KEY'

# The states in which an HPC Pack job (or a local run) has ended.
$script:EndedStates = @('Finished', 'Failed', 'Canceled')

function ConvertTo-HpcTorchArgument {
    # The hpcjob arguments for a command's bound parameters: a switch is its option, a dictionary one
    # option K=V per entry, an array one option per item, anything else one option with its value;
    # always --option=value, so that no value can be read as an option. Then '--' and the arguments.
    [CmdletBinding()]
    [OutputType([string[]])]
    param(
        [Parameter(Mandatory = $true)][string]$Command,
        [Parameter(Mandatory = $true)][System.Collections.IDictionary]$Bound,
        [switch]$WhatIf
    )
    $entry = $script:Cli[$Command]
    $arguments = [System.Collections.Generic.List[string]]::new()
    foreach ($word in $entry.Words) { $arguments.Add($word) }
    foreach ($name in ($entry.Options.Keys | Sort-Object)) {
        if (-not $Bound.Contains($name)) { continue }
        $option = $entry.Options[$name]
        $value = $Bound[$name]
        if ($value -is [System.Management.Automation.SwitchParameter] -or $value -is [bool]) {
            if ($value) { $arguments.Add($option) }
        }
        elseif ($value -is [System.Collections.IDictionary]) {
            foreach ($key in ($value.Keys | Sort-Object)) { $arguments.Add("$option=$key=$($value[$key])") }
        }
        else {
            foreach ($item in @($value)) { $arguments.Add("$option=$item") }
        }
    }
    if ($WhatIf -and $entry.ContainsKey('WhatIf')) { $arguments.Add($entry.WhatIf) }
    $arguments.Add('--')
    foreach ($name in $entry.Arguments) {
        if ($Bound.Contains($name)) { foreach ($item in @($Bound[$name])) { $arguments.Add([string]$item) } }
    }
    return , $arguments.ToArray()
}

function Get-HpcTorchExecutable {
    # hpcjob: $env:HPCJOB_EXE, else the checkout's .venv beside this module, else the one on PATH.
    if ($env:HPCJOB_EXE) { return $env:HPCJOB_EXE }
    $checkout = Split-Path -Parent (Split-Path -Parent $PSScriptRoot)
    foreach ($candidate in @('.venv\Scripts\hpcjob.exe', '.venv/bin/hpcjob')) {
        $path = Join-Path $checkout $candidate
        if (Test-Path -LiteralPath $path) { return $path }
    }
    $found = Get-Command -Name 'hpcjob' -CommandType Application -ErrorAction SilentlyContinue |
        Select-Object -First 1
    if (-not $found) {
        throw 'hpcjob is not installed: pip install "hpcjob[rest,winrm,share]", or set $env:HPCJOB_EXE'
    }
    return $found.Source
}

function ConvertTo-NativeArgument {
    # Windows PowerShell 5.1 and PowerShell 7 before 7.3 (or with $PSNativeCommandArgumentPassing =
    # 'Legacy') join native arguments without escaping: quote each as the C runtime splits them, so that
    # an embedded '"', a trailing '\' or an empty value arrives as it was.
    param([string[]]$Arguments)
    $mode = Get-Variable -Name PSNativeCommandArgumentPassing -ValueOnly -ErrorAction Ignore
    if ($PSVersionTable.PSVersion -ge [version]'7.3' -and $mode -ne 'Legacy') { return , $Arguments }
    $quoted = foreach ($argument in $Arguments) {
        if ($argument -eq '') { '""' }
        elseif ($argument -notmatch '[\s"]') { $argument }
        else { '"' + (($argument -replace '(\\*)"', '$1$1\"') -replace '(\\+)$', '$1$1') + '"' }
    }
    return , @($quoted)
}

function Resolve-HpcTorchPath {
    # A path of this machine as hpcjob (a native program) needs it: ~ and PowerShell drives resolved.
    param([Parameter(Mandatory = $true)][System.Management.Automation.PSCmdlet]$Caller, [string]$Path)
    return $Caller.GetUnresolvedProviderPathFromPSPath($Path)
}

function ConvertTo-PlainText {
    param([Parameter(Mandatory = $true)][securestring]$SecureText)
    return [System.Net.NetworkCredential]::new('', $SecureText).Password
}

function Invoke-HpcTorchCli {
    # Runs hpcjob for $Command with $Bound's arguments; writes its JSON as objects of $TypeName (or its
    # output as text lines), its progress (stderr) to the host, and a failure as an error of $Caller with
    # hpcjob's own one-line message. $Secrets (variable -> text) are set for the child process only.
    [CmdletBinding()]
    param(
        [Parameter(Mandatory = $true)][System.Management.Automation.PSCmdlet]$Caller,
        [Parameter(Mandatory = $true)][string]$Command,
        [Parameter(Mandatory = $true)][System.Collections.IDictionary]$Bound,
        [string]$TypeName,
        [switch]$Text,
        [switch]$WhatIf,
        [System.Collections.IDictionary]$Secrets = @{}
    )
    $arguments = ConvertTo-HpcTorchArgument -Command $Command -Bound $Bound -WhatIf:$WhatIf
    $native = ConvertTo-NativeArgument $arguments
    $executable = Get-HpcTorchExecutable
    # The variables are this process's for the call (its child inherits them), then restored.
    $environment = @{ PYTHONIOENCODING = 'utf-8' } + $Secrets
    $saved = @{}
    foreach ($variable in $environment.Keys) {
        $saved[$variable] = [Environment]::GetEnvironmentVariable($variable)
        [Environment]::SetEnvironmentVariable($variable, $environment[$variable])
    }
    $encoding = [Console]::OutputEncoding
    $stdout = [System.Collections.Generic.List[string]]::new()
    $messages = [System.Collections.Generic.List[string]]::new()
    try {
        [Console]::OutputEncoding = [System.Text.UTF8Encoding]::new($false)
        # hpcjob's stderr arrives as error records: progress, and its one-line errors at the end.
        $ErrorActionPreference = 'Continue'
        $PSNativeCommandUseErrorActionPreference = $false
        & $executable @native 2>&1 | ForEach-Object {
            if ($_ -is [System.Management.Automation.ErrorRecord]) {
                $line = $_.Exception.Message
                if ($line.StartsWith('hpcjob: error: ')) { $messages.Add($line.Substring(15)) }
                else { Write-Host $line }
            }
            elseif ($Text) { $_ }
            else { $stdout.Add([string]$_) }
        }
        $exitCode = $LASTEXITCODE
    }
    finally {
        [Console]::OutputEncoding = $encoding
        foreach ($variable in $saved.Keys) { [Environment]::SetEnvironmentVariable($variable, $saved[$variable]) }
    }
    $message = $messages -join '; '
    if (-not $Text -and $stdout.Count -gt 0) {
        $json = ($stdout -join "`n").Trim()
        if ($json.StartsWith('[') -or $json.StartsWith('{')) {
            foreach ($item in (ConvertFrom-Json -InputObject $json)) {
                if ($TypeName) { $item.PSObject.TypeNames.Insert(0, $TypeName) }
                $item
            }
        }
        else { $stdout }  # -WhatIf: the rendered job, as text
    }
    if ($exitCode -ne 0) {
        if (-not $message) { $message = "hpcjob $($arguments[0]) ended with exit code $exitCode" }
        $category = switch ($exitCode) {
            2 { [System.Management.Automation.ErrorCategory]::InvalidArgument }
            130 { [System.Management.Automation.ErrorCategory]::OperationStopped }
            default { [System.Management.Automation.ErrorCategory]::NotSpecified }
        }
        $record = [System.Management.Automation.ErrorRecord]::new(
            [System.Exception]::new($message), "HpcTorch.ExitCode$exitCode", $category, $Command)
        $Caller.WriteError($record)
    }
}

function Get-CredentialSecret {
    param([pscredential]$Credential)
    if (-not $Credential) { return @{} }
    return @{
        $script:CredentialUserVariable     = $Credential.UserName
        $script:CredentialPasswordVariable = $Credential.GetNetworkCredential().Password
    }
}

function Submit-HpcTorchJob {
    <#
    .SYNOPSIS
    Submits a PyTorch DDP training script to an HPC Pack cluster as one torchrun task per node.

    .DESCRIPTION
    Chooses the nodes (-Node, else idle online nodes of -NodeGroup), uploads the script's folder to the
    cluster's share, mounts the share on the nodes, creates the job and submits it, over the REST API or
    WinRM as the cluster profile says (hpcjob submit). Writes the run and job id, or with -Wait the
    job's summary; -Wait -Pull then copies the run's checkpoints, outputs and logs here (-PullTo: into
    that folder, else .\RUN_ID). -WhatIf shows the job that would be submitted and sends nothing.

    .PARAMETER Script
    The training script; its folder is what gets uploaded.

    .PARAMETER ArgumentList
    Arguments for the script. Give them with -ArgumentList: after the script, a word such as -d would be
    taken for a parameter of this command.

    .PARAMETER Credential
    The head node's user and password, instead of the profile's: they reach hpcjob through its
    environment, never its command line.

    .PARAMETER Secret
    Names of environment variables of this session ($env:NAME) whose values the tasks get as NAME, from
    a file in the job folder only you may read (hpcjob submit --secret): never in the job, the run
    history, a command line or a log.

    .PARAMETER Dataset
    Sources each node copies onto its own disk before the program starts, SOURCE[:ROLE]: a folder on the
    share (datasets/imagenet) or a Blob URL; found in $HPCJOB_DATASETS/NAME (hpcjob submit --dataset).

    .EXAMPLE
    Submit-HpcTorchJob -Cluster prod -Nodes 2 -NprocPerNode 4 -Script .\training\run_ddp.py -ArgumentList '--epochs', '5'

    .EXAMPLE
    Submit-HpcTorchJob -Node GPU001, GPU002 -Script .\train.py -Wait -Credential (Get-Credential CONTOSO\alice)

    .EXAMPLE
    Submit-HpcTorchJob -Node GPU001, GPU002 -Script .\train.py -WhatIf
    Shows the job XML that would be submitted.
    #>
    [CmdletBinding(SupportsShouldProcess = $true, ConfirmImpact = 'Medium')]
    [OutputType('HpcTorch.Submission', 'HpcTorch.JobSummary')]
    param(
        [Parameter(Mandatory = $true, Position = 0)][ValidateNotNullOrEmpty()][string]$Script,
        [Parameter(Position = 1, ValueFromRemainingArguments = $true)][string[]]$ArgumentList,
        [string]$Cluster,
        [ValidateSet('rest', 'winrm')][string]$Backend,
        [ValidateRange(1, 10000)][int]$Nodes,
        [ValidateRange(1, 1024)][int]$NprocPerNode,
        [ValidateRange(1, 1024)][int]$GpusPerNode,
        [string[]]$Node,
        [string]$NodeGroup,
        [string]$Name,
        [string]$Share,
        [string]$MountPoint,
        [string]$MountOptions,
        [string]$JobFolder,
        [ValidateRange(1, 65535)][int]$RdzvPort,
        [ValidateRange(1, 2147483647)][int]$RdzvTimeout,
        [hashtable]$Environment,
        [string[]]$Secret,
        [ValidateRange(0, 1000)][int]$MaxRestarts,
        [ValidateRange(1, 10000)][int]$MinNodes,
        [ValidateRange(1, 2147483647)][int]$RdzvLastCall,
        [ValidateRange(1, 2147483647)][int]$RdzvKeepAlive,
        [string]$Python,
        [ValidateRange(1, 1048576)][int]$CommandLimit,
        [string]$RunId,
        [string]$ResumeFrom,
        [string]$Runtime,
        [string]$HangTimeout,
        [ValidateSet('Lowest', 'BelowNormal', 'Normal', 'AboveNormal', 'Highest')][string]$Priority,
        [string]$JobTemplate,
        [string[]]$ExcludeNode,
        [string]$Requirements,
        [ValidatePattern('^3\.\d+(:[a-z0-9_]+)?$')][string]$Wheelhouse,
        [switch]$NoEnv,
        [ValidateSet('node-local', 'share')][string]$EnvOn,
        [string]$Image,
        [string]$VmSize,
        [ValidateRange(1, 10000)][int]$DataNodes,
        [string[]]$DataNode,
        [string]$DataNodeGroup,
        [ValidateRange(1, 65535)][int]$DataPort,
        [string]$DataWait,
        [string[]]$Dataset,
        [string]$DatasetTimeout,
        [ValidateRange(1, 1000000)][int]$DatasetCacheGb,
        [string]$SmbUser,
        [string]$SmbServer,
        [ValidateRange(1, 65535)][int]$SmbPort,
        [hashtable]$Tag,
        [switch]$Wait,
        [switch]$NoMountStep,
        [ValidateRange(0, 100)][int]$Retries,
        [ValidateSet('outside', 'any')][string]$RetryOn,
        [string]$NodeWait,
        [ValidateRange(0, 1000000000)][double]$MaxCost,
        [switch]$Pull,
        [string]$PullTo,
        [pscredential]$Credential
    )
    $PSBoundParameters['Script'] = Resolve-HpcTorchPath -Caller $PSCmdlet -Path $Script
    if ($Requirements) {
        $PSBoundParameters['Requirements'] = Resolve-HpcTorchPath -Caller $PSCmdlet -Path $Requirements
    }
    if ($PullTo) { $PSBoundParameters['PullTo'] = Resolve-HpcTorchPath -Caller $PSCmdlet -Path $PullTo }
    $target = if ($Node) { $Node -join ', ' } elseif ($Nodes) { "$Nodes node(s)" } else { 'the cluster' }
    if ($PSCmdlet.ShouldProcess($target, "Submit $Script")) {
        Invoke-HpcTorchCli -Caller $PSCmdlet -Command 'Submit-HpcTorchJob' -Bound $PSBoundParameters `
            -TypeName $(if ($Wait) { 'HpcTorch.JobSummary' } else { 'HpcTorch.Submission' }) `
            -Secrets (Get-CredentialSecret $Credential)
    }
    elseif ($WhatIfPreference) {
        Invoke-HpcTorchCli -Caller $PSCmdlet -Command 'Submit-HpcTorchJob' -Bound $PSBoundParameters -WhatIf `
            -Secrets (Get-CredentialSecret $Credential)
    }
}

function Invoke-HpcTorchJob {
    <#
    .SYNOPSIS
    Runs the same job on this machine: N local nodes, each a real torchrun (hpcjob run --local).

    .DESCRIPTION
    Needs Linux (on Windows, run the module in WSL). Writes the job's summary: state, each node's exit
    code, wall time and the training program's metrics; a failed job is also an error.

    .EXAMPLE
    Invoke-HpcTorchJob -Nodes 2 -Script ./training/run_ddp.py

    .EXAMPLE
    Invoke-HpcTorchJob -Nodes 2 -Script ./training/run_ddp.py -ArgumentList '--epochs', '1' -Quiet
    #>
    [CmdletBinding()]
    [OutputType('HpcTorch.JobSummary')]
    param(
        [Parameter(Mandatory = $true, Position = 0)][ValidateNotNullOrEmpty()][string]$Script,
        [Parameter(Position = 1, ValueFromRemainingArguments = $true)][string[]]$ArgumentList,
        [ValidateRange(1, 10000)][int]$Nodes,
        [ValidateRange(1, 1024)][int]$NprocPerNode,
        [ValidateRange(1, 1024)][int]$GpusPerNode,
        [string[]]$Node,
        [string]$NodeGroup,
        [string]$Name,
        [string]$Share,
        [string]$MountPoint,
        [string]$MountOptions,
        [string]$JobFolder,
        [ValidateRange(1, 65535)][int]$RdzvPort,
        [ValidateRange(1, 2147483647)][int]$RdzvTimeout,
        [hashtable]$Environment,
        [string[]]$Secret,
        [ValidateRange(0, 1000)][int]$MaxRestarts,
        [ValidateRange(1, 10000)][int]$MinNodes,
        [ValidateRange(1, 2147483647)][int]$RdzvLastCall,
        [ValidateRange(1, 2147483647)][int]$RdzvKeepAlive,
        [string]$Python,
        [ValidateRange(1, 1048576)][int]$CommandLimit,
        [string]$RunId,
        [string]$ResumeFrom,
        [string]$Runtime,
        [string]$HangTimeout,
        [ValidateSet('Lowest', 'BelowNormal', 'Normal', 'AboveNormal', 'Highest')][string]$Priority,
        [string]$JobTemplate,
        [string[]]$ExcludeNode,
        [string]$Requirements,
        [ValidatePattern('^3\.\d+(:[a-z0-9_]+)?$')][string]$Wheelhouse,
        [switch]$NoEnv,
        [ValidateSet('node-local', 'share')][string]$EnvOn,
        [string]$Image,
        [string]$VmSize,
        [ValidateRange(1, 10000)][int]$DataNodes,
        [string[]]$DataNode,
        [string]$DataNodeGroup,
        [ValidateRange(1, 65535)][int]$DataPort,
        [string]$DataWait,
        [string[]]$Dataset,
        [string]$DatasetTimeout,
        [ValidateRange(1, 1000000)][int]$DatasetCacheGb,
        [hashtable]$Tag,
        [switch]$Quiet,
        [ValidateRange(0, 86400)][double]$GracePeriod,
        [ValidateRange(0, 100)][int]$Retries,
        [ValidateSet('outside', 'any')][string]$RetryOn,
        [switch]$Pull,
        [string]$PullTo
    )
    $PSBoundParameters['Script'] = Resolve-HpcTorchPath -Caller $PSCmdlet -Path $Script
    if ($Requirements) {
        $PSBoundParameters['Requirements'] = Resolve-HpcTorchPath -Caller $PSCmdlet -Path $Requirements
    }
    if ($PullTo) { $PSBoundParameters['PullTo'] = Resolve-HpcTorchPath -Caller $PSCmdlet -Path $PullTo }
    Invoke-HpcTorchCli -Caller $PSCmdlet -Command 'Invoke-HpcTorchJob' -Bound $PSBoundParameters `
        -TypeName 'HpcTorch.JobSummary'
}

function Get-HpcTorchJob {
    <#
    .SYNOPSIS
    The state of jobs and of each of their tasks, asked now (hpcjob status).

    .DESCRIPTION
    With -Id, those jobs (run ids, or HPC Pack job ids); without, the newest -Last runs this machine
    started (hpcjob runs; -Tag, -Since and -Cluster choose among them). -State keeps the jobs in those
    states now.

    .EXAMPLE
    Get-HpcTorchJob -Id 1234

    .EXAMPLE
    Get-HpcTorchJob -State Running | Stop-HpcTorchJob
    #>
    [CmdletBinding()]
    [OutputType('HpcTorch.Job')]
    param(
        [Parameter(Position = 0, ValueFromPipeline = $true, ValueFromPipelineByPropertyName = $true)]
        [Alias('run_id', 'RunId')][ValidateNotNullOrEmpty()][string[]]$Id,
        [ValidateSet('Configuring', 'Submitted', 'Validating', 'ExternalValidation', 'Queued', 'Running',
            'Finishing', 'Finished', 'Failed', 'Canceled', 'Canceling')][string[]]$State,
        [ValidateRange(1, 10000)][int]$Last = 20,
        [hashtable]$Tag,
        [string]$Since,
        [string]$Cluster,
        [ValidateSet('rest', 'winrm')][string]$Backend,
        [pscredential]$Credential
    )
    process {
        $ids = $Id
        if (-not $PSBoundParameters.ContainsKey('Id')) {
            $listing = @{ Last = $Last }
            foreach ($name in @('Cluster', 'Tag', 'Since')) {
                if ($PSBoundParameters.ContainsKey($name)) { $listing[$name] = $PSBoundParameters[$name] }
            }
            $runs = Invoke-HpcTorchCli -Caller $PSCmdlet -Command 'Get-HpcTorchJob:List' -Bound $listing
            # A run rendered for submitting by hand has no job hpcjob can ask about.
            $ids = @($runs | Where-Object { $_.backend -ne 'manual' } | ForEach-Object { $_.run_id })
        }
        foreach ($one in $ids) {
            $bound = @{ Id = $one }
            foreach ($name in @('Cluster', 'Backend')) {
                if ($PSBoundParameters.ContainsKey($name)) { $bound[$name] = $PSBoundParameters[$name] }
            }
            # Id: what this job was asked by, so that piping it on names the same job.
            Invoke-HpcTorchCli -Caller $PSCmdlet -Command 'Get-HpcTorchJob' -Bound $bound `
                -TypeName 'HpcTorch.Job' -Secrets (Get-CredentialSecret $Credential) |
                Add-Member -NotePropertyName Id -NotePropertyValue $one -PassThru |
                Where-Object { -not $State -or $State -contains $_.state }
        }
    }
}

function Wait-HpcTorchJob {
    <#
    .SYNOPSIS
    Waits until jobs end, showing their state; writes each job's final status.

    .DESCRIPTION
    Polls each job's state (hpcjob status) until it has ended. With -Follow, follows each run instead as
    hpcjob wait does, and writes its summary: a run this machine started goes on in more attempts as its
    -Retries say (-MaxCost: none once its attempts cost more US dollars); one follower at a time, so a
    run another hpcjob follows is an error that says which.

    .EXAMPLE
    Submit-HpcTorchJob -Nodes 2 -Script .\train.py | Wait-HpcTorchJob

    .EXAMPLE
    Wait-HpcTorchJob -Id 1234 -Timeout 3600

    .EXAMPLE
    Submit-HpcTorchJob -Nodes 2 -Retries 2 -Script .\train.py | Wait-HpcTorchJob -Follow -MaxCost 50
    #>
    [CmdletBinding()]
    [OutputType('HpcTorch.Job', 'HpcTorch.JobSummary')]
    param(
        [Parameter(Mandatory = $true, Position = 0, ValueFromPipeline = $true, ValueFromPipelineByPropertyName = $true)]
        [Alias('run_id', 'RunId')][ValidateNotNullOrEmpty()][string[]]$Id,
        [ValidateRange(1, 3600)][double]$PollSeconds = 5,
        [ValidateRange(0, 31536000)][double]$Timeout = 0,
        [string]$Cluster,
        [ValidateSet('rest', 'winrm')][string]$Backend,
        [switch]$Follow,
        [ValidateRange(0, 1000000000)][double]$MaxCost,
        [pscredential]$Credential
    )
    process {
        foreach ($one in $Id) {
            if ($Follow) {
                $bound = @{ Id = $one }
                if ($PSBoundParameters.ContainsKey('MaxCost')) { $bound['MaxCost'] = $MaxCost }
                Invoke-HpcTorchCli -Caller $PSCmdlet -Command 'Wait-HpcTorchJob:Follow' -Bound $bound `
                    -TypeName 'HpcTorch.JobSummary' -Secrets (Get-CredentialSecret $Credential)
                continue
            }
            $bound = @{ Id = $one }
            foreach ($name in @('Cluster', 'Backend')) {
                if ($PSBoundParameters.ContainsKey($name)) { $bound[$name] = $PSBoundParameters[$name] }
            }
            $started = [DateTime]::UtcNow
            while ($true) {
                $job = Invoke-HpcTorchCli -Caller $PSCmdlet -Command 'Wait-HpcTorchJob' -Bound $bound `
                    -TypeName 'HpcTorch.Job' -Secrets (Get-CredentialSecret $Credential)
                if (-not $job) { break }  # the error is written: nothing to wait for
                if ($script:EndedStates -contains $job.state) {
                    Write-Progress -Activity "Job $one" -Completed
                    Add-Member -InputObject $job -NotePropertyName Id -NotePropertyValue $one -PassThru
                    break
                }
                $waited = ([DateTime]::UtcNow - $started).TotalSeconds
                if ($Timeout -gt 0 -and $waited -ge $Timeout) {
                    $record = [System.Management.Automation.ErrorRecord]::new(
                        [System.TimeoutException]::new("job $one is still $($job.state) after $Timeout s"),
                        'HpcTorch.WaitTimeout', [System.Management.Automation.ErrorCategory]::OperationTimeout, $one)
                    $PSCmdlet.WriteError($record)
                    break
                }
                Write-Progress -Activity "Job $one" -Status "$($job.state), $([int]$waited) s"
                Start-Sleep -Milliseconds ([int]($PollSeconds * 1000))
            }
        }
    }
}

function Stop-HpcTorchJob {
    <#
    .SYNOPSIS
    Cancels jobs (hpcjob cancel); a job that has ended, or is being canceled, is no error.

    .EXAMPLE
    Stop-HpcTorchJob -Id 1234

    .EXAMPLE
    Get-HpcTorchJob -State Running | Stop-HpcTorchJob -Force
    #>
    [CmdletBinding(SupportsShouldProcess = $true, ConfirmImpact = 'Medium')]
    param(
        [Parameter(Mandatory = $true, Position = 0, ValueFromPipeline = $true, ValueFromPipelineByPropertyName = $true)]
        [Alias('run_id', 'RunId')][ValidateNotNullOrEmpty()][string[]]$Id,
        [switch]$Force,
        [string]$Cluster,
        [ValidateSet('rest', 'winrm')][string]$Backend,
        [pscredential]$Credential
    )
    process {
        foreach ($one in $Id) {
            if (-not $PSCmdlet.ShouldProcess("job $one", 'Cancel')) { continue }
            $bound = @{ Id = $one }
            foreach ($name in @('Cluster', 'Backend', 'Force')) {
                if ($PSBoundParameters.ContainsKey($name)) { $bound[$name] = $PSBoundParameters[$name] }
            }
            Invoke-HpcTorchCli -Caller $PSCmdlet -Command 'Stop-HpcTorchJob' -Bound $bound -Text `
                -Secrets (Get-CredentialSecret $Credential) | ForEach-Object { Write-Verbose $_ }
        }
    }
}

function Receive-HpcTorchJobLog {
    <#
    .SYNOPSIS
    A run's per-node output, each line prefixed by its node (hpcjob logs); -Follow until the job ends.

    .EXAMPLE
    Receive-HpcTorchJobLog -Id 1234 -Follow

    .EXAMPLE
    Receive-HpcTorchJobLog -Id train-20261123-101500-ab12 -Node GPU002 | Select-String error
    #>
    [CmdletBinding()]
    [OutputType([string])]
    param(
        [Parameter(Mandatory = $true, Position = 0, ValueFromPipelineByPropertyName = $true)]
        [Alias('run_id', 'RunId')][ValidateNotNullOrEmpty()][string]$Id,
        [string]$Node,
        [switch]$Follow,
        [string]$Cluster,
        [string]$Share,
        [string]$MountPoint,
        [string]$JobFolder,
        [ValidateRange(0.01, 3600)][double]$PollSeconds,
        [ValidateRange(0, 86400)][double]$IdleTimeout,
        [string]$SmbUser,
        [string]$SmbServer,
        [ValidateRange(1, 65535)][int]$SmbPort,
        [pscredential]$Credential
    )
    process {
        Invoke-HpcTorchCli -Caller $PSCmdlet -Command 'Receive-HpcTorchJobLog' -Bound $PSBoundParameters -Text `
            -Secrets (Get-CredentialSecret $Credential)
    }
}

function Receive-HpcTorchJobResult {
    <#
    .SYNOPSIS
    Copies a run's checkpoints, outputs and logs from the share to a folder here (hpcjob pull).

    .DESCRIPTION
    Into -Destination (else .\RUN_ID) as checkpoints, outputs and logs; only what changed since the last
    copy there, and nothing here is deleted. Only regular files come: a link, a FIFO or a name that is no
    plain file name on the share is skipped, and said. Writes the line that sums the copy up.

    .EXAMPLE
    Receive-HpcTorchJobResult -Id train-20261123-101500-ab12 -Destination .\results

    .EXAMPLE
    Submit-HpcTorchJob -Nodes 2 -Script .\train.py -Wait | Receive-HpcTorchJobResult
    #>
    [CmdletBinding()]
    [OutputType([string])]
    param(
        [Parameter(Mandatory = $true, Position = 0, ValueFromPipelineByPropertyName = $true)]
        [Alias('run_id', 'RunId')][ValidateNotNullOrEmpty()][string]$Id,
        [string]$Destination,
        [string]$SmbUser,
        [string]$SmbServer,
        [ValidateRange(1, 65535)][int]$SmbPort,
        [pscredential]$Credential
    )
    process {
        if ($Destination) {
            $PSBoundParameters['Destination'] = Resolve-HpcTorchPath -Caller $PSCmdlet -Path $Destination
        }
        Invoke-HpcTorchCli -Caller $PSCmdlet -Command 'Receive-HpcTorchJobResult' -Bound $PSBoundParameters -Text `
            -Secrets (Get-CredentialSecret $Credential)
    }
}

function Get-HpcTorchNode {
    <#
    .SYNOPSIS
    The cluster's nodes: state, health, whether a job holds them, cores and GPUs (hpcjob nodes).

    .EXAMPLE
    Get-HpcTorchNode -Cluster prod | Where-Object state -eq Online

    .EXAMPLE
    Get-HpcTorchNode -AllGroups | Format-Table
    #>
    [CmdletBinding()]
    [OutputType('HpcTorch.Node')]
    param(
        [string]$Group,
        [switch]$AllGroups,
        [string]$Cluster,
        [ValidateSet('rest', 'winrm')][string]$Backend,
        [pscredential]$Credential
    )
    Invoke-HpcTorchCli -Caller $PSCmdlet -Command 'Get-HpcTorchNode' -Bound $PSBoundParameters `
        -TypeName 'HpcTorch.Node' -Secrets (Get-CredentialSecret $Credential)
}

function Mount-HpcTorchShare {
    <#
    .SYNOPSIS
    Mounts the share on the nodes with your own credentials, through hpcjob's execution filter, and
    reports each node: mounted, already mounted, or failed with the node's own words (hpcjob mount).

    .EXAMPLE
    Mount-HpcTorchShare -Install -NodeGroup GPUNodes
    Installs the execution filter once (an HPC administrator), then mounts.

    .EXAMPLE
    Mount-HpcTorchShare -Install -NodeGroup GPUNodes -AllowImage nvcr.io/nvidia/
    Installs the filter with a container policy: tasks on the nodes may run only images from that prefix,
    with hpcjob's own docker options and volumes (-AllowDockerOption, -AllowVolume name the whole list
    instead, hpcjob's own included).

    .EXAMPLE
    Mount-HpcTorchShare -Node GPU001 -WhatIf
    Shows what would run on the head node.
    #>
    [CmdletBinding(SupportsShouldProcess = $true, ConfirmImpact = 'Medium')]
    [OutputType('HpcTorch.MountResult')]
    param(
        [string[]]$Node,
        [string]$NodeGroup,
        [string]$Share,
        [string]$MountPoint,
        [string]$MountOptions,
        [switch]$Install,
        [string[]]$AllowImage,
        [string[]]$AllowDockerOption,
        [string[]]$AllowVolume,
        [string]$LocalDisks,
        [string]$Cluster,
        [ValidateSet('rest', 'winrm')][string]$Backend,
        [pscredential]$Credential
    )
    $target = if ($Node) { $Node -join ', ' } elseif ($NodeGroup) { "node group $NodeGroup" } else { 'the nodes' }
    if ($PSCmdlet.ShouldProcess($target, 'Mount the share')) {
        Invoke-HpcTorchCli -Caller $PSCmdlet -Command 'Mount-HpcTorchShare' -Bound $PSBoundParameters `
            -TypeName 'HpcTorch.MountResult' -Secrets (Get-CredentialSecret $Credential)
    }
    elseif ($WhatIfPreference) {
        Invoke-HpcTorchCli -Caller $PSCmdlet -Command 'Mount-HpcTorchShare' -Bound $PSBoundParameters -Text `
            -WhatIf -Secrets (Get-CredentialSecret $Credential)
    }
}

function Test-HpcTorchCluster {
    <#
    .SYNOPSIS
    Checks a cluster before the first job, one result per check with its fix (hpcjob doctor).

    .DESCRIPTION
    The head node and its version, the credentials, the group's nodes, each node's GPUs, torch and
    CUDA, the share on every node and from here, and a 2-node all-reduce (in the environment of
    -Requirements, in containers of -Image). A failed check is also an error. With -Local, this machine
    instead, for local runs: Python and torch, CUDA and the GPUs, a 2-node all-reduce on loopback, the
    rendezvous port, disk for environments, Docker (local runs need Linux: in WSL on Windows).

    .EXAMPLE
    Test-HpcTorchCluster -Cluster prod | Where-Object result -ne 'pass'
    #>
    [CmdletBinding()]
    [OutputType('HpcTorch.Check')]
    param(
        [string]$Cluster,
        [ValidateSet('rest', 'winrm')][string]$Backend,
        [string]$Requirements,
        [string]$Image,
        [switch]$Local,
        [pscredential]$Credential
    )
    # doctor --json is one report: {cluster, backend, checks}; the checks are what a user filters.
    if ($Requirements) {
        $PSBoundParameters['Requirements'] = Resolve-HpcTorchPath -Caller $PSCmdlet -Path $Requirements
    }
    Invoke-HpcTorchCli -Caller $PSCmdlet -Command 'Test-HpcTorchCluster' -Bound $PSBoundParameters `
        -Secrets (Get-CredentialSecret $Credential) | ForEach-Object {
        foreach ($check in $_.checks) {
            $check.PSObject.TypeNames.Insert(0, 'HpcTorch.Check')
            $check
        }
    }
}

function New-HpcTorchCluster {
    <#
    .SYNOPSIS
    Deploys a GPU cluster from HPC Pack's ARM template and writes its hpcjob profile (hpcjob cluster onboard).

    .DESCRIPTION
    Checks everything first (name, node count, GPU size and image, quota, every template parameter),
    then runs az with the template pinned to a commit, shows each resource as it finishes, writes the
    cluster's profile, mounts the share on the nodes and runs the checks of Test-HpcTorchCluster. The
    admin password and the nodes' authentication key reach hpcjob through its environment and az
    through its standard input, never a command line. -WhatIf writes the parameters file and prints the
    az commands; -WhatIfAzure asks Azure what it would create. -PurgeDeletedVault purges the soft-deleted
    Key Vault of an earlier cluster in a resource group of the same name, which would make the deployment
    fail. -Spot makes the compute nodes Spot VMs (evicted when Azure needs the room; a run that loses one
    goes on elsewhere with -Retries). Needs the Azure CLI, logged in.

    .EXAMPLE
    New-HpcTorchCluster -Name gpu1 -ResourceGroup rg-gpu1 -Location eastus -VmSize Standard_NC24ads_A100_v4 -Nodes 2 -AdminPassword (Read-Host -AsSecureString)

    .EXAMPLE
    New-HpcTorchCluster -Name gpu1 -ResourceGroup rg-gpu1 -Location eastus -VmSize Standard_NC24ads_A100_v4 -Nodes 2 -WhatIf
    #>
    [CmdletBinding(SupportsShouldProcess = $true, ConfirmImpact = 'High')]
    param(
        [Parameter(Mandatory = $true, Position = 0)][ValidatePattern('^[a-z][a-z0-9]{2,14}$')][string]$Name,
        [Parameter(Mandatory = $true)][string]$ResourceGroup,
        [Parameter(Mandatory = $true)][string]$Location,
        [Parameter(Mandatory = $true)][string]$VmSize,
        [Parameter(Mandatory = $true)][ValidateRange(1, 500)][int]$Nodes,
        [string]$AdminUser,
        [securestring]$AdminPassword,
        [securestring]$AuthenticationKey,
        [string]$Image,
        [string]$NodePrefix,
        [string]$HeadNodeSize,
        [string]$Identity,
        [string]$OutputFolder,
        [string]$Template,
        [ValidateRange(1, 3600)][double]$PollSeconds,
        [switch]$WhatIfAzure,
        [switch]$PurgeDeletedVault,
        [switch]$Spot,
        [ValidateRange(1, 500)][int]$DataNodes,
        [string]$DataVmSize,
        [switch]$NoCheck,
        [switch]$Default
    )
    $secrets = @{}
    $deploying = -not $WhatIfPreference -and -not (Test-Path "Env:$script:AdminPasswordVariable")
    if (-not $AdminPassword -and $deploying) {
        # hpcjob's own prompt would go to the output this module reads: ask here instead.
        $AdminPassword = Read-Host -AsSecureString -Prompt "Admin password for the VMs of cluster $Name"
    }
    if ($AdminPassword) { $secrets[$script:AdminPasswordVariable] = ConvertTo-PlainText $AdminPassword }
    if ($AuthenticationKey) { $secrets[$script:AuthKeyVariable] = ConvertTo-PlainText $AuthenticationKey }
    foreach ($name in @('Template', 'OutputFolder')) {
        if ($PSBoundParameters.ContainsKey($name)) {
            $PSBoundParameters[$name] = Resolve-HpcTorchPath -Caller $PSCmdlet -Path $PSBoundParameters[$name]
        }
    }
    $deploy = $PSCmdlet.ShouldProcess("resource group $ResourceGroup", "Deploy HPC Pack cluster $Name")
    if ($deploy -or $WhatIfPreference) {
        Invoke-HpcTorchCli -Caller $PSCmdlet -Command 'New-HpcTorchCluster' -Bound $PSBoundParameters -Text `
            -WhatIf:(-not $deploy) -Secrets $secrets
    }
}

Export-ModuleMember -Function @(
    'Submit-HpcTorchJob', 'Get-HpcTorchJob', 'Wait-HpcTorchJob', 'Stop-HpcTorchJob', 'Receive-HpcTorchJobLog',
    'Get-HpcTorchNode', 'Mount-HpcTorchShare', 'Test-HpcTorchCluster', 'New-HpcTorchCluster',
    'Invoke-HpcTorchJob', 'Receive-HpcTorchJobResult'
)
