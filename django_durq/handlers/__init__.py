"""What a job type is: the ``@job`` decorator and its registry, the options and limits it takes,
the arguments and JSON payload of a job, its retry delays, and the ``JobContext`` a handler gets.

The vocabulary every other room speaks; it imports nothing above settings and models.
"""
