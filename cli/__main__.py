from cudasnap.exits import entry

entry()
