# hpcjob: submit run run_ddp-20261122-000000-abcd (2 node(s)) by hand.
# Run on the head node in Windows PowerShell 5.1 as an HPC Pack administrator (clusrun /user:system
# mounts the share as root on the nodes). The code must already be in /app/hpcjob/run_ddp
# on the nodes (hpcjob render --upload puts it there).
$ErrorActionPreference = 'Stop'
if (-not (Get-PSSnapin Microsoft.HPC -ErrorAction SilentlyContinue)) { Add-PSSnapin Microsoft.HPC }
# The node list is quoted: unquoted, PowerShell would read its commas as an array.
clusrun /user:system '/nodes:GPUNODE001,GPUNODE002' 'm=/app; mkdir -p $m && { mountpoint -q $m || mount -t cifs //HEADNODE/CcpSpoolDir/app $m -o vers=3.0,credentials=/etc/hpcjob/smb-credentials,dir_mode=0777,file_mode=0777; } && mkdir -p $m/hpcjob/run_ddp/logs/run_ddp-20261122-000000-abcd'
if ($LASTEXITCODE -ne 0) { throw "mounting the share failed on a node (clusrun exit code $LASTEXITCODE)" }
$jobFile = Join-Path $env:TEMP 'run_ddp-20261122-000000-abcd.xml'
Set-Content -LiteralPath $jobFile -Encoding UTF8 -Value @'
<?xml version="1.0" encoding="utf-8"?>
<Job Version="3.000" Name="run_ddp-20261122-000000-abcd" IsExclusive="true" UnitType="Node" AutoCalculateMax="false" AutoCalculateMin="false" FailOnTaskFailure="true" MinNodes="2" MaxNodes="2" RequestedNodes="GPUNODE001,GPUNODE002" NodeGroups="GPUNodes" xmlns="http://schemas.microsoft.com/HPCS2008R2/scheduler/">
  <EnvironmentVariables>
    <Variable>
      <Name>NCCL_DEBUG</Name>
      <Value>WARN</Value>
    </Variable>
  </EnvironmentVariables>
  <Tasks>
    <Task Name="torchrun GPUNODE001" CommandLine=". .hpcjob/node.sh GPUNODE001 run_ddp-20261122-000000-abcd &amp;&amp; python3 -m torch.distributed.run --nnodes=2 --nproc_per_node=4 --rdzv_backend=c10d --rdzv_endpoint=GPUNODE001:29400 --rdzv_id=run_ddp-20261122-000000-abcd --rdzv_conf=is_host=$HPCJOB_IS_HOST --local_addr=$HPCJOB_ADDR --max_restarts=0 .hpcjob/worker.py run_ddp.py --epochs 5 --data fashion-mnist --data-root /app/data" MinNodes="1" MaxNodes="1" RequiredNodes="GPUNODE001" IsRerunnable="false" WorkDirectory="/app/hpcjob/run_ddp" StdOutFilePath="/app/hpcjob/run_ddp/logs/run_ddp-20261122-000000-abcd/GPUNODE001.out" StdErrFilePath="/app/hpcjob/run_ddp/logs/run_ddp-20261122-000000-abcd/GPUNODE001.err" />
    <Task Name="torchrun GPUNODE002" CommandLine=". .hpcjob/node.sh GPUNODE001 run_ddp-20261122-000000-abcd &amp;&amp; python3 -m torch.distributed.run --nnodes=2 --nproc_per_node=4 --rdzv_backend=c10d --rdzv_endpoint=GPUNODE001:29400 --rdzv_id=run_ddp-20261122-000000-abcd --rdzv_conf=is_host=$HPCJOB_IS_HOST --local_addr=$HPCJOB_ADDR --max_restarts=0 .hpcjob/worker.py run_ddp.py --epochs 5 --data fashion-mnist --data-root /app/data" MinNodes="1" MaxNodes="1" RequiredNodes="GPUNODE002" IsRerunnable="false" WorkDirectory="/app/hpcjob/run_ddp" StdOutFilePath="/app/hpcjob/run_ddp/logs/run_ddp-20261122-000000-abcd/GPUNODE002.out" StdErrFilePath="/app/hpcjob/run_ddp/logs/run_ddp-20261122-000000-abcd/GPUNODE002.err" />
  </Tasks>
</Job>
'@
$job = New-HpcJob -JobFile $jobFile
Submit-HpcJob -Job $job
Write-Output "submitted job $($job.Id) (run run_ddp-20261122-000000-abcd); logs: /app/hpcjob/run_ddp/logs/run_ddp-20261122-000000-abcd"
