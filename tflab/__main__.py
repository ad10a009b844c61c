"""python -m tflab"""

from tflab.cli import main

main()
