//! The operations the recorder observes, forwarded one by one: each request re-signed and sent,
//! its answer read into s3s's types.

use super::*;

#[async_trait::async_trait]
impl S3 for Upstream {
    async fn get_object(
        &self,
        req: S3Request<GetObjectInput>,
    ) -> S3Result<S3Response<GetObjectOutput>> {
        let (bucket, key) = (&req.input.bucket, &req.input.key);
        let resp = self
            .direct
            .send(Method::GET, &req, bucket, Some(key), Payload::None)
            .await?;
        let (parts, body) = resp.into_parts();
        let h = &parts.headers;
        let output = GetObjectOutput {
            body: Some(Idle::wrap(body, self.direct.timeout)),
            content_length: content_length(h),
            content_range: header_of(h, "content-range"),
            e_tag: etag(h),
            version_id: header_of(h, "x-amz-version-id"),
            ..Default::default()
        };
        Ok(answer(output, &parts))
    }

    async fn head_object(
        &self,
        req: S3Request<HeadObjectInput>,
    ) -> S3Result<S3Response<HeadObjectOutput>> {
        let (bucket, key) = (&req.input.bucket, &req.input.key);
        let resp = self
            .direct
            .send(Method::HEAD, &req, bucket, Some(key), Payload::None)
            .await?;
        let (parts, _) = resp.into_parts();
        let h = &parts.headers;
        let output = HeadObjectOutput {
            content_length: content_length(h),
            e_tag: etag(h),
            version_id: header_of(h, "x-amz-version-id"),
            ..Default::default()
        };
        Ok(answer(output, &parts))
    }

    async fn put_object(
        &self,
        mut req: S3Request<PutObjectInput>,
    ) -> S3Result<S3Response<PutObjectOutput>> {
        let payload = Payload::client(req.input.body.take(), req.input.content_length)?;
        let (bucket, key) = (&req.input.bucket, &req.input.key);
        let resp = self
            .direct
            .send(Method::PUT, &req, bucket, Some(key), payload)
            .await?;
        let (parts, _) = resp.into_parts();
        let h = &parts.headers;
        let output = PutObjectOutput {
            e_tag: etag(h),
            version_id: header_of(h, "x-amz-version-id"),
            ..Default::default()
        };
        Ok(answer(output, &parts))
    }

    async fn upload_part(
        &self,
        mut req: S3Request<UploadPartInput>,
    ) -> S3Result<S3Response<UploadPartOutput>> {
        let payload = Payload::client(req.input.body.take(), req.input.content_length)?;
        let (bucket, key) = (&req.input.bucket, &req.input.key);
        let resp = self
            .direct
            .send(Method::PUT, &req, bucket, Some(key), payload)
            .await?;
        let (parts, _) = resp.into_parts();
        let output = UploadPartOutput {
            e_tag: etag(&parts.headers),
            ..Default::default()
        };
        Ok(answer(output, &parts))
    }

    async fn upload_part_copy(
        &self,
        req: S3Request<UploadPartCopyInput>,
    ) -> S3Result<S3Response<UploadPartCopyOutput>> {
        let (bucket, key) = (&req.input.bucket, &req.input.key);
        let resp = self
            .direct
            .send(Method::PUT, &req, bucket, Some(key), Payload::None)
            .await?;
        let (parts, body) = resp.into_parts();
        let xml = self.direct.read_body(body, ANSWER_LIMIT).await?;
        let output = UploadPartCopyOutput {
            copy_part_result: Some(answers::copy_part_result(&xml)?),
            copy_source_version_id: header_of(&parts.headers, "x-amz-copy-source-version-id"),
            ..Default::default()
        };
        Ok(answer(output, &parts))
    }

    async fn copy_object(
        &self,
        req: S3Request<CopyObjectInput>,
    ) -> S3Result<S3Response<CopyObjectOutput>> {
        let (bucket, key) = (&req.input.bucket, &req.input.key);
        let resp = self
            .direct
            .send(Method::PUT, &req, bucket, Some(key), Payload::None)
            .await?;
        let (parts, body) = resp.into_parts();
        let xml = self.direct.read_body(body, ANSWER_LIMIT).await?;
        let h = &parts.headers;
        let output = CopyObjectOutput {
            copy_object_result: Some(answers::copy_object_result(&xml)?),
            version_id: header_of(h, "x-amz-version-id"),
            copy_source_version_id: header_of(h, "x-amz-copy-source-version-id"),
            ..Default::default()
        };
        Ok(answer(output, &parts))
    }

    async fn delete_object(
        &self,
        req: S3Request<DeleteObjectInput>,
    ) -> S3Result<S3Response<DeleteObjectOutput>> {
        let (bucket, key) = (&req.input.bucket, &req.input.key);
        let resp = self
            .direct
            .send(Method::DELETE, &req, bucket, Some(key), Payload::None)
            .await?;
        let (parts, _) = resp.into_parts();
        let h = &parts.headers;
        let output = DeleteObjectOutput {
            delete_marker: header_str(h, "x-amz-delete-marker").map(|v| v == "true"),
            version_id: header_of(h, "x-amz-version-id"),
            ..Default::default()
        };
        Ok(answer(output, &parts))
    }

    async fn delete_objects(
        &self,
        req: S3Request<DeleteObjectsInput>,
    ) -> S3Result<S3Response<DeleteObjectsOutput>> {
        let payload = Payload::Made {
            body: answers::body_of(&req.input.delete)?,
            body_checksums: true,
        };
        let bucket = &req.input.bucket;
        let resp = self
            .direct
            .send(Method::POST, &req, bucket, None, payload)
            .await?;
        let (parts, body) = resp.into_parts();
        let xml = self.direct.read_body(body, ANSWER_LIMIT).await?;
        Ok(answer(answers::delete_result(&xml)?, &parts))
    }

    async fn abort_multipart_upload(
        &self,
        req: S3Request<AbortMultipartUploadInput>,
    ) -> S3Result<S3Response<AbortMultipartUploadOutput>> {
        let (bucket, key) = (&req.input.bucket, &req.input.key);
        let resp = self
            .direct
            .send(Method::DELETE, &req, bucket, Some(key), Payload::None)
            .await?;
        let (parts, _) = resp.into_parts();
        Ok(answer(AbortMultipartUploadOutput::default(), &parts))
    }

    async fn complete_multipart_upload(
        &self,
        req: S3Request<CompleteMultipartUploadInput>,
    ) -> S3Result<S3Response<CompleteMultipartUploadOutput>> {
        let body = match &req.input.multipart_upload {
            Some(parts) => answers::body_of(parts)?,
            None => Bytes::new(),
        };
        let payload = Payload::Made {
            body,
            body_checksums: false,
        };
        let (bucket, key) = (&req.input.bucket, &req.input.key);
        let resp = self
            .direct
            .send(Method::POST, &req, bucket, Some(key), payload)
            .await?;
        let (parts, body) = resp.into_parts();
        let xml = self.direct.read_body(body, ANSWER_LIMIT).await?;
        let mut output = answers::complete_result(&xml)?;
        output.version_id = header_of(&parts.headers, "x-amz-version-id");
        Ok(answer(output, &parts))
    }
}
