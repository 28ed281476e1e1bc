"""Black-box end-to-end tests of the real gateway process in front of fake worker processes."""
