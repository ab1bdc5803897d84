# Timekeeper's image: one image for web (gunicorn), worker, beat, Flower and the migrate job.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app

# A fixed numeric uid/gid (10001): Kubernetes' runAsNonRoot can verify only a numeric user.
RUN groupadd --system --gid 10001 timekeeper \
    && useradd --system --uid 10001 --gid timekeeper --home-dir /app --no-create-home timekeeper

COPY requirements.txt ./
RUN pip install -r requirements.txt

COPY . .

# Static files are baked into the image (served by WhiteNoise). The key exists only for this
# command: settings refuse to load without one when DEBUG is off.
RUN SECRET_KEY=collectstatic-at-build-time-only DEBUG=0 python manage.py collectstatic --noinput \
    && chown -R timekeeper:timekeeper /app/var

USER timekeeper

EXPOSE 8000 5555

# The config file checks the settings and servers first (one line and exit status 78 when wrong).
CMD ["gunicorn", "--config=python:project.gunicorn_conf", "project.wsgi:application", "--bind=0.0.0.0:8000", "--access-logfile=-"]
