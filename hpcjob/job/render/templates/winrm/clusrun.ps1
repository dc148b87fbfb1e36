# Run a bash command as root on the nodes (clusrun /user:system: an HPC administrator's right). The
# command arrives in base64, so that no quoting of PowerShell, clusrun or the node's shell can change it.
# UNVERIFIED: that /nodes: takes a comma-separated list, and that clusrun's exit code is non-zero when a
# node failed; its per-node output is shown to people, never parsed.
param($Data)
$arguments = @('/user:system', "/nodes:$($Data.Nodes -join ',')", "echo $($Data.CommandBase64) | base64 -d | bash")
$output = & clusrun.exe @arguments 2>&1 | Out-String
[pscustomobject]@{ ExitCode = $LASTEXITCODE; Output = $output }
