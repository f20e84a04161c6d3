"""Report: text tables, exports and plots of estimates."""
