"""What the FFT tests compare: each transform kind and direction's NumPy function and ours."""

import numpy as np

import dask_redist.fft as F

NUMPY = {
    ("c2c", False): np.fft.fftn,
    ("c2c", True): np.fft.ifftn,
    ("r2c", False): np.fft.rfftn,
    ("c2r", True): np.fft.irfftn,
}
OURS = {("c2c", False): F.fftn, ("c2c", True): F.ifftn, ("r2c", False): F.rfftn, ("c2r", True): F.irfftn}
