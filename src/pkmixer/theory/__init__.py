"""The theory as code: effective weights, width calculus, spectra, implicit regularisation."""
