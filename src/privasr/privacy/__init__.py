"""Privacy: differential privacy (mechanisms, clipping, accounting) and the statistics of the empirical audit
(epsilon lower bounds from attack error rates, canary exposure, likelihood-ratio tests). Anonymisation lives in
:mod:`privasr.anon`."""
