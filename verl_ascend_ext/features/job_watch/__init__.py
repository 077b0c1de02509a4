"""A lost process ends the job: the driver watches the job's processes and stops the job, naming the first lost."""
