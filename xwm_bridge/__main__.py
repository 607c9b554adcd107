from xwm_bridge.cli import main

main()
