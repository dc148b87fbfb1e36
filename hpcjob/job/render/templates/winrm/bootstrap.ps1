# The one command line hpcjob runs on the head node, fixed and short (-EncodedCommand): the script and
# its data come over stdin as one ASCII JSON object {Script, Data}, so no value is ever part of a
# command line or of a script's text, and no length limit applies. .NET reads the request, not a cmdlet:
# PowerShell's module logging records the values cmdlets are given, and the request holds the password.
$ErrorActionPreference = 'Stop'
$ProgressPreference = 'SilentlyContinue'
# Windows PowerShell 5.1 writes warnings and information (Write-Host) to stdout, where the answer is:
# silenced, and the answer has a line of its own, the last (the client reads that line alone).
$WarningPreference = 'SilentlyContinue'
$InformationPreference = 'SilentlyContinue'
Add-Type -AssemblyName System.Web.Extensions
$reader = New-Object -TypeName System.Web.Script.Serialization.JavaScriptSerializer
$reader.MaxJsonLength = [int]::MaxValue
$request = $reader.DeserializeObject([Console]::In.ReadToEnd())
try {
    $result = & ([ScriptBlock]::Create($request['Script'])) $request['Data']
    $json = ConvertTo-Json -InputObject @($result) -Compress -Depth 6
    # ASCII, whatever the console's code page: every other character as \uXXXX.
    [Console]::Out.Write("`r`n" + [regex]::Replace($json, '[^\x00-\x7F]', { param($m) '\u{0:x4}' -f [int][char]$m.Value }))
} catch {
    [Console]::Error.Write($_.Exception.Message)
    exit 1
}
