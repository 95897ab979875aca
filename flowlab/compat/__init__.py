"""Compatibility APIs: ``flowlab.compat.v1`` runs TensorFlow-1-style graph and session code.

>>> import flowlab.compat.v1 as tf
>>> with tf.Graph().as_default():
...     y = tf.constant(2) + 300
...     with tf.Session() as sess:
...         print(sess.run(y))
302
"""
from . import v1  # noqa: F401
