from delaywheel.cli import main

main()
