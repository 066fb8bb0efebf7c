"""Shared test set-up: quiet TensorFlow's C++ logging before it is imported."""
import os

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
