from danube.cli.main import main

raise SystemExit(main())
