from edgepack.cli.main import main

main()
