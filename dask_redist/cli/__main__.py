import sys

from dask_redist.cli import main

sys.exit(main())
