from cudasnap.entry import main

main()
