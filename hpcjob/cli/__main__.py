from hpcjob.cli import main

main()
