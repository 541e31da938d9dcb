"""One widget per panel of the run screen."""
