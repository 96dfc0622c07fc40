from cudasnap.cli import main

main()
