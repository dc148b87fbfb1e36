# hpcjob: submit run run_ddp-20261122-000000-abcd (2 node(s)) by hand.
# Run on the head node in Windows PowerShell 5.1 as an HPC Pack administrator. The code must already
# be in /app/hpcjob/run_ddp on the nodes (hpcjob render --upload puts it there).
# First, clusrun /user:system mounts the share as root on the nodes.
# The job: exclusive, one torchrun task per node with 4 process(es) each, rendezvous at GPUNODE001:29400.
# Nodes: GPUNODE001, GPUNODE002
# Node group: GPUNodes
# Environment variables: TORCH_FR_BUFFER_SIZE, TORCH_NCCL_TRACE_BUFFER_SIZE, TORCH_NCCL_DUMP_ON_TIMEOUT, TORCH_FR_DUMP_TEMP_FILE, TORCH_NCCL_DEBUG_INFO_TEMP_FILE, NCCL_DEBUG, HPCJOB_MOUNT
# The job file is what `hpcjob render --format xml --run-id RUN` prints with the same options. It is
# carried as base64 of its UTF-8 bytes: no value in it (an environment variable, a script argument)
# can end the string and run here.
$ErrorActionPreference = 'Stop'
if (-not (Get-PSSnapin Microsoft.HPC -ErrorAction SilentlyContinue)) { Add-PSSnapin Microsoft.HPC }
$runId = 'run_ddp-20261122-000000-abcd'
$logDir = '/app/hpcjob/run_ddp/logs/run_ddp-20261122-000000-abcd'
# The node list is quoted: unquoted, PowerShell would read its commas as an array.
clusrun /user:system '/nodes:GPUNODE001,GPUNODE002' 'm=/app; mkdir -p $m && { mountpoint -q $m || mount -t cifs //HEADNODE/CcpSpoolDir/app $m -o vers=3.0,credentials=/etc/hpcjob/smb-credentials,dir_mode=0777,file_mode=0777; } && mkdir -p $m/hpcjob/run_ddp/logs/run_ddp-20261122-000000-abcd'
if ($LASTEXITCODE -ne 0) { throw "mounting the share failed on a node (clusrun exit code $LASTEXITCODE)" }
$jobFile = Join-Path $env:TEMP ($runId + '.xml')
# The file gets the job XML's own bytes: UTF-8 without a BOM, as `job submit /jobfile:` takes the
# output of --format xml; the XML declaration names the encoding, and no text conversion touches a value.
[System.IO.File]::WriteAllBytes($jobFile, [Convert]::FromBase64String(-join @(
    'PD94bWwgdmVyc2lvbj0iMS4wIiBlbmNvZGluZz0idXRmLTgiPz4KPEpvYiBWZXJzaW9uPSIzLjAwMCIgTmFtZT0icnVuX2RkcC0y'
    'MDI2MTEyMi0wMDAwMDAtYWJjZCIgSXNFeGNsdXNpdmU9InRydWUiIFVuaXRUeXBlPSJOb2RlIiBBdXRvQ2FsY3VsYXRlTWF4PSJm'
    'YWxzZSIgQXV0b0NhbGN1bGF0ZU1pbj0iZmFsc2UiIEZhaWxPblRhc2tGYWlsdXJlPSJ0cnVlIiBNaW5Ob2Rlcz0iMiIgTWF4Tm9k'
    'ZXM9IjIiIFJlcXVlc3RlZE5vZGVzPSJHUFVOT0RFMDAxLEdQVU5PREUwMDIiIE5vZGVHcm91cHM9IkdQVU5vZGVzIiB4bWxucz0i'
    'aHR0cDovL3NjaGVtYXMubWljcm9zb2Z0LmNvbS9IUENTMjAwOFIyL3NjaGVkdWxlci8iPgogIDxFbnZpcm9ubWVudFZhcmlhYmxl'
    'cz4KICAgIDxWYXJpYWJsZT4KICAgICAgPE5hbWU+VE9SQ0hfRlJfQlVGRkVSX1NJWkU8L05hbWU+CiAgICAgIDxWYWx1ZT4yMDAw'
    'PC9WYWx1ZT4KICAgIDwvVmFyaWFibGU+CiAgICA8VmFyaWFibGU+CiAgICAgIDxOYW1lPlRPUkNIX05DQ0xfVFJBQ0VfQlVGRkVS'
    'X1NJWkU8L05hbWU+CiAgICAgIDxWYWx1ZT4yMDAwPC9WYWx1ZT4KICAgIDwvVmFyaWFibGU+CiAgICA8VmFyaWFibGU+CiAgICAg'
    'IDxOYW1lPlRPUkNIX05DQ0xfRFVNUF9PTl9USU1FT1VUPC9OYW1lPgogICAgICA8VmFsdWU+MTwvVmFsdWU+CiAgICA8L1Zhcmlh'
    'YmxlPgogICAgPFZhcmlhYmxlPgogICAgICA8TmFtZT5UT1JDSF9GUl9EVU1QX1RFTVBfRklMRTwvTmFtZT4KICAgICAgPFZhbHVl'
    'Pi9hcHAvaHBjam9iL3J1bl9kZHAvbG9ncy9ydW5fZGRwLTIwMjYxMTIyLTAwMDAwMC1hYmNkL25jY2wtdHJhY2UtcmFuay08L1Zh'
    'bHVlPgogICAgPC9WYXJpYWJsZT4KICAgIDxWYXJpYWJsZT4KICAgICAgPE5hbWU+VE9SQ0hfTkNDTF9ERUJVR19JTkZPX1RFTVBf'
    'RklMRTwvTmFtZT4KICAgICAgPFZhbHVlPi9hcHAvaHBjam9iL3J1bl9kZHAvbG9ncy9ydW5fZGRwLTIwMjYxMTIyLTAwMDAwMC1h'
    'YmNkL25jY2wtdHJhY2UtcmFuay08L1ZhbHVlPgogICAgPC9WYXJpYWJsZT4KICAgIDxWYXJpYWJsZT4KICAgICAgPE5hbWU+TkND'
    'TF9ERUJVRzwvTmFtZT4KICAgICAgPFZhbHVlPldBUk48L1ZhbHVlPgogICAgPC9WYXJpYWJsZT4KICAgIDxWYXJpYWJsZT4KICAg'
    'ICAgPE5hbWU+SFBDSk9CX01PVU5UPC9OYW1lPgogICAgICA8VmFsdWU+Ly9IRUFETk9ERS9DY3BTcG9vbERpci9hcHB8L2FwcDwv'
    'VmFsdWU+CiAgICA8L1ZhcmlhYmxlPgogIDwvRW52aXJvbm1lbnRWYXJpYWJsZXM+CiAgPFRhc2tzPgogICAgPFRhc2sgTmFtZT0i'
    'dG9yY2hydW4gR1BVTk9ERTAwMSIgQ29tbWFuZExpbmU9Ii4gLmhwY2pvYi9ub2RlLnNoIEdQVU5PREUwMDEgcnVuX2RkcC0yMDI2'
    'MTEyMi0wMDAwMDAtYWJjZCAmYW1wOyZhbXA7IHB5dGhvbjMgLW0gdG9yY2guZGlzdHJpYnV0ZWQucnVuIC0tbm5vZGVzPTIgLS1u'
    'cHJvY19wZXJfbm9kZT00IC0tcmR6dl9iYWNrZW5kPWMxMGQgLS1yZHp2X2VuZHBvaW50PUdQVU5PREUwMDE6Mjk0MDAgLS1yZHp2'
    'X2lkPXJ1bl9kZHAtMjAyNjExMjItMDAwMDAwLWFiY2QgLS1yZHp2X2NvbmY9aXNfaG9zdD0kSFBDSk9CX0lTX0hPU1QgLS1sb2Nh'
    'bF9hZGRyPSRIUENKT0JfQUREUiAtLW1heF9yZXN0YXJ0cz0wIC5ocGNqb2Ivd29ya2VyLnB5IHJ1bl9kZHAucHkgLS1lcG9jaHMg'
    'NSAtLWRhdGEgZmFzaGlvbi1tbmlzdCAtLWRhdGEtcm9vdCAvYXBwL2RhdGEiIE1pbk5vZGVzPSIxIiBNYXhOb2Rlcz0iMSIgUmVx'
    'dWlyZWROb2Rlcz0iR1BVTk9ERTAwMSIgSXNSZXJ1bm5hYmxlPSJmYWxzZSIgV29ya0RpcmVjdG9yeT0iL2FwcC9ocGNqb2IvcnVu'
    'X2RkcCIgU3RkT3V0RmlsZVBhdGg9Ii9hcHAvaHBjam9iL3J1bl9kZHAvbG9ncy9ydW5fZGRwLTIwMjYxMTIyLTAwMDAwMC1hYmNk'
    'L0dQVU5PREUwMDEub3V0IiBTdGRFcnJGaWxlUGF0aD0iL2FwcC9ocGNqb2IvcnVuX2RkcC9sb2dzL3J1bl9kZHAtMjAyNjExMjIt'
    'MDAwMDAwLWFiY2QvR1BVTk9ERTAwMS5lcnIiIC8+CiAgICA8VGFzayBOYW1lPSJ0b3JjaHJ1biBHUFVOT0RFMDAyIiBDb21tYW5k'
    'TGluZT0iLiAuaHBjam9iL25vZGUuc2ggR1BVTk9ERTAwMSBydW5fZGRwLTIwMjYxMTIyLTAwMDAwMC1hYmNkICZhbXA7JmFtcDsg'
    'cHl0aG9uMyAtbSB0b3JjaC5kaXN0cmlidXRlZC5ydW4gLS1ubm9kZXM9MiAtLW5wcm9jX3Blcl9ub2RlPTQgLS1yZHp2X2JhY2tl'
    'bmQ9YzEwZCAtLXJkenZfZW5kcG9pbnQ9R1BVTk9ERTAwMToyOTQwMCAtLXJkenZfaWQ9cnVuX2RkcC0yMDI2MTEyMi0wMDAwMDAt'
    'YWJjZCAtLXJkenZfY29uZj1pc19ob3N0PSRIUENKT0JfSVNfSE9TVCAtLWxvY2FsX2FkZHI9JEhQQ0pPQl9BRERSIC0tbWF4X3Jl'
    'c3RhcnRzPTAgLmhwY2pvYi93b3JrZXIucHkgcnVuX2RkcC5weSAtLWVwb2NocyA1IC0tZGF0YSBmYXNoaW9uLW1uaXN0IC0tZGF0'
    'YS1yb290IC9hcHAvZGF0YSIgTWluTm9kZXM9IjEiIE1heE5vZGVzPSIxIiBSZXF1aXJlZE5vZGVzPSJHUFVOT0RFMDAyIiBJc1Jl'
    'cnVubmFibGU9ImZhbHNlIiBXb3JrRGlyZWN0b3J5PSIvYXBwL2hwY2pvYi9ydW5fZGRwIiBTdGRPdXRGaWxlUGF0aD0iL2FwcC9o'
    'cGNqb2IvcnVuX2RkcC9sb2dzL3J1bl9kZHAtMjAyNjExMjItMDAwMDAwLWFiY2QvR1BVTk9ERTAwMi5vdXQiIFN0ZEVyckZpbGVQ'
    'YXRoPSIvYXBwL2hwY2pvYi9ydW5fZGRwL2xvZ3MvcnVuX2RkcC0yMDI2MTEyMi0wMDAwMDAtYWJjZC9HUFVOT0RFMDAyLmVyciIg'
    'Lz4KICA8L1Rhc2tzPgo8L0pvYj4K'
)))
$job = New-HpcJob -JobFile $jobFile
Submit-HpcJob -Job $job
Write-Output "submitted job $($job.Id) (run $runId); logs: $logDir"
