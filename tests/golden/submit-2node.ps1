# hpcjob: submit run run_ddp-20261122-000000-abcd (2 node(s)) by hand.
# Run on the head node in Windows PowerShell 5.1 as an HPC Pack administrator. The code must already
# be in /app/hpcjob/run_ddp on the nodes (hpcjob render --upload puts it there).
# First, clusrun /user:system mounts the share as root on the nodes.
# The job: exclusive, one torchrun task per node with 4 process(es) each, rendezvous at GPUNODE001:29400.
# Nodes: GPUNODE001, GPUNODE002
# Node group: GPUNodes
# Environment variables: TORCH_FR_BUFFER_SIZE, TORCH_NCCL_TRACE_BUFFER_SIZE, TORCH_NCCL_DUMP_ON_TIMEOUT, TORCH_FR_DUMP_TEMP_FILE, TORCH_NCCL_DEBUG_INFO_TEMP_FILE, HPCJOB_CHECKPOINT_DIR, HPCJOB_OUTPUT_DIR, HPCJOB_ATTEMPT, NCCL_DEBUG, HPCJOB_MOUNT
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
    'YmNkL25jY2wtdHJhY2UtcmFuay08L1ZhbHVlPgogICAgPC9WYXJpYWJsZT4KICAgIDxWYXJpYWJsZT4KICAgICAgPE5hbWU+SFBD'
    'Sk9CX0NIRUNLUE9JTlRfRElSPC9OYW1lPgogICAgICA8VmFsdWU+L2FwcC9ocGNqb2IvcnVuX2RkcC9jaGVja3BvaW50cy9ydW5f'
    'ZGRwLTIwMjYxMTIyLTAwMDAwMC1hYmNkPC9WYWx1ZT4KICAgIDwvVmFyaWFibGU+CiAgICA8VmFyaWFibGU+CiAgICAgIDxOYW1l'
    'PkhQQ0pPQl9PVVRQVVRfRElSPC9OYW1lPgogICAgICA8VmFsdWU+L2FwcC9ocGNqb2IvcnVuX2RkcC9vdXRwdXRzL3J1bl9kZHAt'
    'MjAyNjExMjItMDAwMDAwLWFiY2Q8L1ZhbHVlPgogICAgPC9WYXJpYWJsZT4KICAgIDxWYXJpYWJsZT4KICAgICAgPE5hbWU+SFBD'
    'Sk9CX0FUVEVNUFQ8L05hbWU+CiAgICAgIDxWYWx1ZT4xPC9WYWx1ZT4KICAgIDwvVmFyaWFibGU+CiAgICA8VmFyaWFibGU+CiAg'
    'ICAgIDxOYW1lPk5DQ0xfREVCVUc8L05hbWU+CiAgICAgIDxWYWx1ZT5XQVJOPC9WYWx1ZT4KICAgIDwvVmFyaWFibGU+CiAgICA8'
    'VmFyaWFibGU+CiAgICAgIDxOYW1lPkhQQ0pPQl9NT1VOVDwvTmFtZT4KICAgICAgPFZhbHVlPi8vSEVBRE5PREUvQ2NwU3Bvb2xE'
    'aXIvYXBwfC9hcHA8L1ZhbHVlPgogICAgPC9WYXJpYWJsZT4KICA8L0Vudmlyb25tZW50VmFyaWFibGVzPgogIDxUYXNrcz4KICAg'
    'IDxUYXNrIE5hbWU9InRvcmNocnVuIEdQVU5PREUwMDEiIENvbW1hbmRMaW5lPSIuIC5ocGNqb2Ivbm9kZS5zaCBHUFVOT0RFMDAx'
    'IHJ1bl9kZHAtMjAyNjExMjItMDAwMDAwLWFiY2QgJmFtcDsmYW1wOyBweXRob24zIC1tIHRvcmNoLmRpc3RyaWJ1dGVkLnJ1biAt'
    'LW5ub2Rlcz0yIC0tbnByb2NfcGVyX25vZGU9NCAtLXJkenZfYmFja2VuZD1jMTBkIC0tcmR6dl9lbmRwb2ludD1HUFVOT0RFMDAx'
    'OjI5NDAwIC0tcmR6dl9pZD1ydW5fZGRwLTIwMjYxMTIyLTAwMDAwMC1hYmNkIC0tcmR6dl9jb25mPWlzX2hvc3Q9JEhQQ0pPQl9J'
    'U19IT1NUIC0tbG9jYWxfYWRkcj0kSFBDSk9CX0FERFIgLS1tYXhfcmVzdGFydHM9MCAuaHBjam9iL3dvcmtlci5weSBydW5fZGRw'
    'LnB5IC0tZXBvY2hzIDUgLS1kYXRhIGZhc2hpb24tbW5pc3QgLS1kYXRhLXJvb3QgL2FwcC9kYXRhIiBNaW5Ob2Rlcz0iMSIgTWF4'
    'Tm9kZXM9IjEiIFJlcXVpcmVkTm9kZXM9IkdQVU5PREUwMDEiIElzUmVydW5uYWJsZT0iZmFsc2UiIFdvcmtEaXJlY3Rvcnk9Ii9h'
    'cHAvaHBjam9iL3J1bl9kZHAiIFN0ZE91dEZpbGVQYXRoPSIvYXBwL2hwY2pvYi9ydW5fZGRwL2xvZ3MvcnVuX2RkcC0yMDI2MTEy'
    'Mi0wMDAwMDAtYWJjZC9HUFVOT0RFMDAxLm91dCIgU3RkRXJyRmlsZVBhdGg9Ii9hcHAvaHBjam9iL3J1bl9kZHAvbG9ncy9ydW5f'
    'ZGRwLTIwMjYxMTIyLTAwMDAwMC1hYmNkL0dQVU5PREUwMDEuZXJyIiAvPgogICAgPFRhc2sgTmFtZT0idG9yY2hydW4gR1BVTk9E'
    'RTAwMiIgQ29tbWFuZExpbmU9Ii4gLmhwY2pvYi9ub2RlLnNoIEdQVU5PREUwMDEgcnVuX2RkcC0yMDI2MTEyMi0wMDAwMDAtYWJj'
    'ZCAmYW1wOyZhbXA7IHB5dGhvbjMgLW0gdG9yY2guZGlzdHJpYnV0ZWQucnVuIC0tbm5vZGVzPTIgLS1ucHJvY19wZXJfbm9kZT00'
    'IC0tcmR6dl9iYWNrZW5kPWMxMGQgLS1yZHp2X2VuZHBvaW50PUdQVU5PREUwMDE6Mjk0MDAgLS1yZHp2X2lkPXJ1bl9kZHAtMjAy'
    'NjExMjItMDAwMDAwLWFiY2QgLS1yZHp2X2NvbmY9aXNfaG9zdD0kSFBDSk9CX0lTX0hPU1QgLS1sb2NhbF9hZGRyPSRIUENKT0Jf'
    'QUREUiAtLW1heF9yZXN0YXJ0cz0wIC5ocGNqb2Ivd29ya2VyLnB5IHJ1bl9kZHAucHkgLS1lcG9jaHMgNSAtLWRhdGEgZmFzaGlv'
    'bi1tbmlzdCAtLWRhdGEtcm9vdCAvYXBwL2RhdGEiIE1pbk5vZGVzPSIxIiBNYXhOb2Rlcz0iMSIgUmVxdWlyZWROb2Rlcz0iR1BV'
    'Tk9ERTAwMiIgSXNSZXJ1bm5hYmxlPSJmYWxzZSIgV29ya0RpcmVjdG9yeT0iL2FwcC9ocGNqb2IvcnVuX2RkcCIgU3RkT3V0Rmls'
    'ZVBhdGg9Ii9hcHAvaHBjam9iL3J1bl9kZHAvbG9ncy9ydW5fZGRwLTIwMjYxMTIyLTAwMDAwMC1hYmNkL0dQVU5PREUwMDIub3V0'
    'IiBTdGRFcnJGaWxlUGF0aD0iL2FwcC9ocGNqb2IvcnVuX2RkcC9sb2dzL3J1bl9kZHAtMjAyNjExMjItMDAwMDAwLWFiY2QvR1BV'
    'Tk9ERTAwMi5lcnIiIC8+CiAgPC9UYXNrcz4KPC9Kb2I+Cg=='
)))
$job = New-HpcJob -JobFile $jobFile
Submit-HpcJob -Job $job
Write-Output "submitted job $($job.Id) (run $runId); logs: $logDir"
