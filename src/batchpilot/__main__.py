from batchpilot.cli import main

main()
