from edgepack.cli import main

main()
