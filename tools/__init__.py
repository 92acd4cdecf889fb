"""Development tools of the source repository: checks, generators and fakes; not part of the installed package."""
