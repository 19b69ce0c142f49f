from tinytrain.pipeline.cli import main

raise SystemExit(main())
