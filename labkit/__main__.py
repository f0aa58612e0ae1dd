from labkit.cli import main

raise SystemExit(main())
