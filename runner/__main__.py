from runner.client import main

main()
