"""Calibration: commands whose output the service loads (thresholds, quality curves, the
sentence scorer's weights).
"""
