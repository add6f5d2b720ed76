from factory.cli import main

main()
