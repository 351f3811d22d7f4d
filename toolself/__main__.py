from toolself.cli import main

main()
